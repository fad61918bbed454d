//! Path templates that name what they capture: `**/job_{job}/step_*/task_{rank}`. A
//! template is `/`-separated components; `**` alone is any number of components (none
//! included), and a component is literal text with `*` (any text within the component) and
//! the captures `{job}` and `{rank}`. A template matches a path when it matches its first
//! components (the path itself or one of its descendants' paths: a socket lives in a leaf
//! below the directory that names its job). `{job}` is required; no capture or `*` may
//! follow another without text between them, which would make the split ambiguous.
use std::fmt;

use anyhow::{bail, Result};

/// One piece of a component.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Star,
    Capture(Capture),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Capture {
    Job,
    Rank,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Component {
    /// `**`: any number of components.
    Any,
    Pieces(Vec<Piece>),
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    source: String,
    components: Vec<Component>,
}

/// What a match captured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captures {
    pub job: String,
    pub rank: Option<String>,
}

impl fmt::Display for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl PathPattern {
    /// Parses a template; the error says what is wrong with it in one line.
    pub fn parse(s: &str) -> Result<Self> {
        let body = s.trim_start_matches('/');
        if body.is_empty() {
            bail!("{s:?}: empty");
        }
        let (mut jobs, mut ranks) = (0, 0);
        let mut components = Vec::new();
        for c in body.split('/') {
            if c.is_empty() {
                bail!("{s:?}: an empty component (two slashes, or one at the end)");
            }
            if c == "**" {
                components.push(Component::Any);
                continue;
            }
            if c.contains("**") {
                bail!("{s:?}: `**` must be a whole component");
            }
            let pieces = pieces(s, c)?;
            for p in &pieces {
                match p {
                    Piece::Capture(Capture::Job) => jobs += 1,
                    Piece::Capture(Capture::Rank) => ranks += 1,
                    _ => {}
                }
            }
            components.push(Component::Pieces(pieces));
        }
        if jobs != 1 {
            bail!("{s:?}: needs `{{job}}` exactly once (it has {jobs})");
        }
        if ranks > 1 {
            bail!("{s:?}: `{{rank}}` may appear once (it has {ranks})");
        }
        Ok(Self {
            source: s.to_owned(),
            components,
        })
    }

    /// The captures of the first match against the leading components of `path`
    /// (components of a path relative to the cgroup root), if any.
    pub fn matches(&self, path: &[&str]) -> Option<Captures> {
        let mut caps = Captures::default();
        matches_from(&self.components, path, &mut caps).then_some(caps)
    }
}

/// A component's pieces.
fn pieces(whole: &str, c: &str) -> Result<Vec<Piece>> {
    let mut out: Vec<Piece> = Vec::new();
    let mut text = String::new();
    let mut rest = c;
    while let Some(ch) = rest.chars().next() {
        let wild = match ch {
            '*' => {
                rest = &rest[1..];
                Some(Piece::Star)
            }
            '{' => {
                let Some(end) = rest.find('}') else {
                    bail!("{whole:?}: an unclosed `{{`");
                };
                let cap = match &rest[1..end] {
                    "job" => Capture::Job,
                    "rank" => Capture::Rank,
                    other => {
                        bail!("{whole:?}: unknown capture `{{{other}}}` (known: {{job}}, {{rank}})")
                    }
                };
                rest = &rest[end + 1..];
                Some(Piece::Capture(cap))
            }
            '}' => bail!("{whole:?}: a `}}` without its `{{`"),
            _ => {
                text.push(ch);
                rest = &rest[ch.len_utf8()..];
                None
            }
        };
        if let Some(w) = wild {
            if !text.is_empty() {
                out.push(Piece::Text(std::mem::take(&mut text)));
            } else if matches!(out.last(), Some(Piece::Star | Piece::Capture(_))) {
                bail!("{whole:?}: `*` or a capture right after another in {c:?} (put text between them)");
            }
            out.push(w);
        }
    }
    if !text.is_empty() {
        out.push(Piece::Text(text));
    }
    Ok(out)
}

fn matches_from(pattern: &[Component], path: &[&str], caps: &mut Captures) -> bool {
    let Some((first, rest)) = pattern.split_first() else {
        return true;
    };
    match first {
        Component::Any => (0..=path.len()).any(|skip| {
            let mut c = caps.clone();
            let ok = matches_from(rest, &path[skip..], &mut c);
            if ok {
                *caps = c;
            }
            ok
        }),
        Component::Pieces(pieces) => {
            let Some((name, path_rest)) = path.split_first() else {
                return false;
            };
            let mut c = caps.clone();
            if match_pieces(pieces, name, &mut c) && matches_from(rest, path_rest, &mut c) {
                *caps = c;
                return true;
            }
            false
        }
    }
}

/// Whether `pieces` match the whole of `s`; captures take the shortest text that lets the
/// rest match (never empty).
fn match_pieces(pieces: &[Piece], s: &str, caps: &mut Captures) -> bool {
    let Some((first, rest)) = pieces.split_first() else {
        return s.is_empty();
    };
    match first {
        Piece::Text(t) => s
            .strip_prefix(t.as_str())
            .is_some_and(|r| match_pieces(rest, r, caps)),
        Piece::Star | Piece::Capture(_) => {
            let min = usize::from(matches!(first, Piece::Capture(_)));
            for (i, _) in s.char_indices().chain([(s.len(), ' ')]) {
                if i < min {
                    continue;
                }
                let mut c = caps.clone();
                match first {
                    Piece::Capture(Capture::Job) => c.job = s[..i].to_owned(),
                    Piece::Capture(Capture::Rank) => c.rank = Some(s[..i].to_owned()),
                    _ => {}
                }
                if match_pieces(rest, &s[i..], &mut c) {
                    *caps = c;
                    return true;
                }
            }
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, path: &str) -> Option<Captures> {
        let parts: Vec<&str> = path.split('/').collect();
        PathPattern::parse(p).unwrap().matches(&parts)
    }

    #[test]
    fn captures_name_the_job_and_rank() {
        // `task_{rank}` must be the component right after `step_*`: here `user` is.
        assert_eq!(
            m(
                "**/job_{job}/step_*/task_{rank}",
                "system.slice/slurmstepd.scope/job_4242/step_0/user/task_3",
            ),
            None
        );
        let c = m(
            "**/job_{job}/step_*/**/task_{rank}",
            "system.slice/slurmstepd.scope/job_4242/step_0/user/task_3",
        )
        .unwrap();
        assert_eq!((c.job.as_str(), c.rank.as_deref()), ("4242", Some("3")));
        // A prefix match: the job's directory names it, whatever leaf the socket is in.
        let c = m(
            "training.slice/{job}-rank{rank}.scope",
            "training.slice/llm-rank7.scope/x",
        )
        .unwrap();
        assert_eq!((c.job.as_str(), c.rank.as_deref()), ("llm", Some("7")));
        assert_eq!(m("training.slice/{job}.scope", "other.slice/a.scope"), None);
        assert_eq!(
            m("a/{job}", "a"),
            None,
            "the path is shorter than the template"
        );
        assert_eq!(m("a/x{job}", "a/x"), None, "a capture is never empty");
        assert_eq!(m("/jobs/{job}", "jobs/j1").unwrap().job, "j1");
    }

    #[test]
    fn bad_templates_are_refused_in_one_line() {
        for (p, why) in [
            ("", "empty"),
            ("a//{job}", "empty component"),
            ("a/{job}/", "empty component"),
            ("a**/{job}", "whole component"),
            ("a/{jobs}", "unknown capture"),
            ("a/{job", "unclosed"),
            ("a/job}", "without its"),
            ("a/b", "exactly once"),
            ("{job}/{job}", "exactly once"),
            ("{job}/{rank}/{rank}", "once"),
            ("a/{job}{rank}", "right after another"),
            ("a/*{job}", "right after another"),
        ] {
            let e = PathPattern::parse(p).unwrap_err().to_string();
            assert!(e.contains(why), "{p:?}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
