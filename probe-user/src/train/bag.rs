//! A bag of boosters as one LightGBM text model: the trees of every booster, each leaf
//! value divided by their number, so the one model's raw score is the mean of theirs. On
//! the corpus, which seed a classifier was fitted with moved held-out PR-AUC as much as the
//! recipe did (docs/model.md); the mean of a few is steadier than any one of them.
use anyhow::{bail, Context as _, Result};

/// The header of a LightGBM text model (up to its first tree) and its tree blocks.
fn parts(text: &str) -> Result<(&str, Vec<&str>)> {
    let start = text.find("\nTree=0\n").context("a model without trees")? + 1;
    let end = text
        .find("\nend of trees")
        .context("a model without \"end of trees\"")?;
    let trees = text[start..end]
        .split("\n\n")
        .map(str::trim)
        .filter(|b| !b.is_empty())
        .collect();
    Ok((&text[..start], trees))
}

/// Merges LightGBM text models of the same features and objective (see the module doc).
/// The header is the first model's, without `tree_sizes` (the loaders then read the trees
/// in order); feature importances and parameters are left out.
pub fn merge(texts: &[String]) -> Result<String> {
    if texts.len() == 1 {
        return Ok(texts[0].clone());
    }
    let Some(first) = texts.first() else {
        bail!("no model to merge");
    };
    let (header, _) = parts(first)?;
    let mut out: String = header
        .lines()
        .filter(|l| !l.starts_with("tree_sizes="))
        .map(|l| format!("{l}\n"))
        .collect();
    let k = texts.len() as f64;
    let mut n = 0;
    for text in texts {
        let (h, trees) = parts(text)?;
        if h.lines().find(|l| l.starts_with("feature_names="))
            != header.lines().find(|l| l.starts_with("feature_names="))
        {
            bail!("the models of a bag read different features");
        }
        for tree in trees {
            for line in tree.lines() {
                if line.starts_with("Tree=") {
                    out.push_str(&format!("Tree={n}\n"));
                } else if let Some(values) = line.strip_prefix("leaf_value=") {
                    let scaled: Result<Vec<String>> = values
                        .split(' ')
                        .map(|v| {
                            let v: f64 = v.parse().with_context(|| format!("leaf value {v:?}"))?;
                            Ok(format!("{}", v / k))
                        })
                        .collect();
                    out.push_str(&format!("leaf_value={}\n", scaled?.join(" ")));
                } else {
                    out.push_str(line);
                    out.push('\n');
                }
            }
            out.push('\n');
            n += 1;
        }
    }
    out.push_str("end of trees\n");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::lgbm::Booster;

    /// A one-split model on feature `a`: `lo` below 0.5, `hi` above.
    fn stump(lo: f64, hi: f64) -> String {
        format!(
            "tree\nversion=v4\nnum_class=1\nnum_tree_per_iteration=1\nlabel_index=0\n\
             max_feature_idx=1\nobjective=binary sigmoid:1\nfeature_names=a b\n\
             feature_infos=[0:1] [0:1]\n\n\
             Tree=0\nnum_leaves=2\nnum_cat=0\nsplit_feature=0\nsplit_gain=1\n\
             threshold=0.5\ndecision_type=2\nleft_child=-1\nright_child=-2\n\
             leaf_value={lo} {hi}\nleaf_weight=1 1\nleaf_count=1 1\ninternal_value=0\n\
             internal_weight=0\ninternal_count=2\nis_linear=0\nshrinkage=1\n\n\n\
             end of trees\n\nfeature_importances:\na=1\n"
        )
    }

    #[test]
    fn the_bag_scores_the_mean_of_its_models() {
        let texts = [stump(-1.0, 2.0), stump(0.5, 1.0), stump(-2.0, -0.25)];
        let merged = merge(&texts).unwrap();
        let bag = Booster::parse(&merged).unwrap();
        assert_eq!(bag.num_trees(), 3);
        for x in [0.2, 0.9] {
            let mean = texts
                .iter()
                .map(|t| Booster::parse(t).unwrap().raw_score(&[x, 0.0]))
                .sum::<f64>()
                / 3.0;
            assert!((bag.raw_score(&[x, 0.0]) - mean).abs() < 1e-12);
        }
        // The trees' sizes change: the header must not list them.
        let sized = stump(0.0, 1.0).replace("feature_infos", "tree_sizes=999\nfeature_infos");
        assert!(!merge(&[sized.clone(), sized])
            .unwrap()
            .contains("tree_sizes"));
        let other = stump(0.0, 1.0).replace("feature_names=a b", "feature_names=a c");
        assert!(merge(&[stump(0.0, 1.0), other]).is_err());
    }
}
