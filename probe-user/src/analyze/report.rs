//! The report: one document model rendered twice, as Markdown (figures as SVG files beside
//! it) and as one self-contained HTML page (figures inline), so the two never disagree.
use std::fmt::Write as _;

pub enum Block {
    Heading(u8, String),
    Para(String),
    List(Vec<String>),
    Table(Vec<String>, Vec<Vec<String>>),
    /// A figure: its file name beside the Markdown, and its SVG text.
    Figure(String, String),
}

pub struct Doc {
    pub title: String,
    pub blocks: Vec<Block>,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

impl Doc {
    pub fn new(title: impl Into<String>) -> Self {
        Doc {
            title: title.into(),
            blocks: Vec::new(),
        }
    }

    pub fn h(&mut self, level: u8, t: impl Into<String>) {
        self.blocks.push(Block::Heading(level, t.into()));
    }

    pub fn p(&mut self, t: impl Into<String>) {
        self.blocks.push(Block::Para(t.into()));
    }

    pub fn list(&mut self, items: Vec<String>) {
        self.blocks.push(Block::List(items));
    }

    pub fn table(&mut self, head: &[&str], rows: Vec<Vec<String>>) {
        self.blocks.push(Block::Table(
            head.iter().map(|h| (*h).to_owned()).collect(),
            rows,
        ));
    }

    pub fn figure(&mut self, file: impl Into<String>, svg: String) {
        self.blocks.push(Block::Figure(file.into(), svg));
    }

    /// The figures to write beside the Markdown.
    pub fn figures(&self) -> impl Iterator<Item = (&str, &str)> {
        self.blocks.iter().filter_map(|b| match b {
            Block::Figure(f, svg) => Some((f.as_str(), svg.as_str())),
            _ => None,
        })
    }

    pub fn markdown(&self) -> String {
        let mut o = format!("# {}\n\n", self.title);
        for b in &self.blocks {
            match b {
                Block::Heading(l, t) => {
                    let _ = writeln!(o, "{} {t}\n", "#".repeat(*l as usize + 1));
                }
                Block::Para(t) => {
                    let _ = writeln!(o, "{t}\n");
                }
                Block::List(items) => {
                    for i in items {
                        let _ = writeln!(o, "- {i}");
                    }
                    o.push('\n');
                }
                Block::Table(head, rows) => {
                    let _ = writeln!(o, "| {} |", head.join(" | "));
                    let _ = writeln!(o, "|{}", "---|".repeat(head.len()));
                    for r in rows {
                        let _ = writeln!(o, "| {} |", r.join(" | ").replace('\n', " "));
                    }
                    o.push('\n');
                }
                Block::Figure(f, _) => {
                    let _ = writeln!(o, "![{f}]({f})\n");
                }
            }
        }
        o
    }

    pub fn html(&self) -> String {
        let mut o = String::new();
        let _ = write!(
            o,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
             <title>{}</title><style>\
             body{{font-family:sans-serif;max-width:1040px;margin:2em auto;padding:0 1em;color:#222}}\
             table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:left}}\
             th{{background:#f3f3f3}}figure{{margin:1em 0}}figure svg{{max-width:100%;height:auto}}\
             code{{background:#f3f3f3;padding:0 3px}}</style></head><body>\n<h1>{}</h1>\n",
            esc(&self.title),
            esc(&self.title)
        );
        for b in &self.blocks {
            match b {
                Block::Heading(l, t) => {
                    let _ = writeln!(o, "<h{n}>{}</h{n}>", esc(t), n = l + 1);
                }
                Block::Para(t) => {
                    let _ = writeln!(o, "<p>{}</p>", inline_marks(&esc(t)));
                }
                Block::List(items) => {
                    o.push_str("<ul>\n");
                    for i in items {
                        let _ = writeln!(o, "<li>{}</li>", inline_marks(&esc(i)));
                    }
                    o.push_str("</ul>\n");
                }
                Block::Table(head, rows) => {
                    o.push_str("<table><tr>");
                    for h in head {
                        let _ = write!(o, "<th>{}</th>", esc(h));
                    }
                    o.push_str("</tr>\n");
                    for r in rows {
                        o.push_str("<tr>");
                        for c in r {
                            let _ = write!(o, "<td>{}</td>", inline_marks(&esc(c)));
                        }
                        o.push_str("</tr>\n");
                    }
                    o.push_str("</table>\n");
                }
                Block::Figure(f, svg) => {
                    // The SVG's own XML declaration is not allowed inside HTML.
                    let body = svg.find("<svg").map_or(svg.as_str(), |i| &svg[i..]);
                    let _ = writeln!(o, "<figure id=\"{}\">{body}</figure>", esc(f));
                }
            }
        }
        o.push_str("</body></html>\n");
        o
    }
}

/// Markdown's inline marks in already escaped text: `text` in backticks becomes <code>, and
/// **text** outside code becomes <strong> (an unpaired `**` stays as written).
fn inline_marks(s: &str) -> String {
    let mut out = String::new();
    for (i, part) in s.split('`').enumerate() {
        if i % 2 == 1 {
            let _ = write!(out, "<code>{part}</code>");
        } else {
            let pieces: Vec<&str> = part.split("**").collect();
            for (j, p) in pieces.iter().enumerate() {
                if j % 2 == 0 {
                    out.push_str(p);
                } else if j + 1 < pieces.len() {
                    let _ = write!(out, "<strong>{p}</strong>");
                } else {
                    let _ = write!(out, "**{p}");
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_renders_bold_outside_code_and_leaves_an_unpaired_mark() {
        let mut d = Doc::new("t");
        d.p("the pattern is **ring**, `a**b**` and **open");
        d.list(vec!["**no** change".into()]);
        let h = d.html();
        assert!(
            h.contains(
                "<p>the pattern is <strong>ring</strong>, <code>a**b**</code> and **open</p>"
            ),
            "{h}"
        );
        assert!(h.contains("<li><strong>no</strong> change</li>"), "{h}");
        // The Markdown keeps its own marks.
        assert!(d.markdown().contains("the pattern is **ring**"));
    }

    #[test]
    fn html_escapes_text_and_inlines_figures_without_their_xml_declaration() {
        let mut d = Doc::new("a <b> & c");
        d.p("run `probe analyze` <now>");
        d.table(&["x"], vec![vec!["1 < 2".into()]]);
        d.figure(
            "f.svg",
            "<?xml version=\"1.0\"?>\n<svg width=\"1\"></svg>".into(),
        );
        let h = d.html();
        assert!(h.contains("<title>a &lt;b&gt; &amp; c</title>"));
        assert!(h.contains("run <code>probe analyze</code> &lt;now&gt;"));
        assert!(h.contains("<td>1 &lt; 2</td>"));
        assert!(h.contains("<figure id=\"f.svg\"><svg width=\"1\"></svg></figure>"));
        assert!(!h.contains("<?xml"));
        let md = d.markdown();
        assert!(md.starts_with("# a <b> & c\n"));
        assert!(md.contains("![f.svg](f.svg)"));
        assert_eq!(d.figures().count(), 1);
    }
}
