//! tracefs: mounted on demand (aya reads tracepoint ids from it too), and the source of
//! tracepoint record layouts, which differ between kernel versions.
use std::{
    collections::HashMap,
    ffi::CString,
    path::{Path, PathBuf},
};

use anyhow::{anyhow, bail, Context as _, Result};

const TRACEFS: &str = "/sys/kernel/tracing";
const DEBUGFS_TRACING: &str = "/sys/kernel/debug/tracing";

/// The root of a mounted tracefs, if there is one.
pub fn mounted() -> Option<PathBuf> {
    [TRACEFS, DEBUGFS_TRACING]
        .into_iter()
        .find(|p| Path::new(p).join("events").is_dir())
        .map(PathBuf::from)
}

/// The tracefs root, mounting it at /sys/kernel/tracing if no tracefs is mounted.
pub fn root() -> Result<PathBuf> {
    if let Some(p) = mounted() {
        return Ok(p);
    }
    let target = CString::new(TRACEFS)?;
    let fstype = CString::new("tracefs")?;
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        bail!("tracefs is not mounted and mounting it at {TRACEFS} failed: {err} (mount it: mount -t tracefs tracefs {TRACEFS})");
    }
    tracing::info!("mounted tracefs at {TRACEFS} (tracepoints need it)");
    Ok(PathBuf::from(TRACEFS))
}

/// A tracepoint's `format` file: its record layout and print format.
pub struct EventFormat {
    pub text: String,
    pub fields: HashMap<String, (u32, u32)>,
}

impl EventFormat {
    pub fn read(root: &Path, category: &str, event: &str) -> Result<Self> {
        let path = root
            .join("events")
            .join(category)
            .join(event)
            .join("format");
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "tracepoint {category}:{event} is not available ({})",
                path.display()
            )
        })?;
        let fields =
            parse_format(&text).ok_or_else(|| anyhow!("cannot parse {}", path.display()))?;
        Ok(Self { text, fields })
    }

    /// Offset of `field`, or an error naming it.
    pub fn offset(&self, field: &str) -> Result<u32> {
        self.fields
            .get(field)
            .map(|(o, _)| *o)
            .ok_or_else(|| anyhow!("the record has no field `{field}`"))
    }

    /// The value -> name table of `__print_symbolic(REC->field, { 2, "NAME" }, ...)` in the
    /// print format: how the kernel itself names an enum field (e.g. drop reasons).
    pub fn symbols(&self, field: &str) -> HashMap<u32, String> {
        parse_symbolic(&self.text, field)
    }
}

/// The `__print_symbolic` table of `field` in a print format (empty if there is none).
pub fn parse_symbolic(text: &str, field: &str) -> HashMap<u32, String> {
    let mut out = HashMap::new();
    let marker = format!("__print_symbolic(REC->{field},");
    let Some(start) = text.find(&marker) else {
        return out;
    };
    let mut rest = &text[start + marker.len()..];
    // Entries look like `{ 2, "NOT_SPECIFIED" }`; the list ends at the closing `)`.
    while let Some(open) = rest.find('{') {
        if rest[..open].contains(')') {
            break;
        }
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        let entry = &rest[open + 1..open + close];
        if let Some((num, name)) = entry.split_once(',') {
            let name = name.trim().trim_matches('"');
            if let Ok(n) = num.trim().parse::<u32>() {
                out.insert(n, name.to_owned());
            }
        }
        rest = &rest[open + close + 1..];
    }
    out
}

/// The fields of a `format` file: name -> (offset, size); None if a field line is malformed.
pub fn parse_format(text: &str) -> Option<HashMap<String, (u32, u32)>> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("field:") else {
            continue;
        };
        let mut decl = "";
        let mut offset = None;
        let mut size = None;
        for part in rest.split(';') {
            let part = part.trim();
            if let Some(v) = part.strip_prefix("offset:") {
                offset = v.parse().ok();
            } else if let Some(v) = part.strip_prefix("size:") {
                size = v.parse().ok();
            } else if decl.is_empty() {
                decl = part;
            }
        }
        // `__u8 saddr[4]` -> `saddr`; `__data_loc char[] name` -> `name`.
        let name = decl.rsplit([' ', '*']).next()?;
        let name = name.split('[').next()?;
        out.insert(name.to_owned(), (offset?, size?));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    // The 6.x layout of tcp:tcp_retransmit_skb.
    const FORMAT: &str = "name: tcp_retransmit_skb
ID: 1474
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:const void * skbaddr;\toffset:8;\tsize:8;\tsigned:0;
\tfield:const void * skaddr;\toffset:16;\tsize:8;\tsigned:0;
\tfield:int state;\toffset:24;\tsize:4;\tsigned:1;
\tfield:__u16 sport;\toffset:28;\tsize:2;\tsigned:0;
\tfield:__u16 dport;\toffset:30;\tsize:2;\tsigned:0;
\tfield:__u16 family;\toffset:32;\tsize:2;\tsigned:0;
\tfield:__u8 saddr[4];\toffset:34;\tsize:4;\tsigned:0;
\tfield:__u8 daddr[4];\toffset:38;\tsize:4;\tsigned:0;
\tfield:__u8 saddr_v6[16];\toffset:42;\tsize:16;\tsigned:0;
\tfield:__u8 daddr_v6[16];\toffset:58;\tsize:16;\tsigned:0;

print fmt: \"...\"
";

    #[test]
    fn parses_symbolic_tables() {
        let text = "print fmt: \"reason: %s\", __print_symbolic(REC->reason, { 2, \"NOT_SPECIFIED\" }, { 12, \"NETFILTER_DROP\" }), REC->x, __print_symbolic(REC->state, { 1, \"X\" })";
        let m = parse_symbolic(text, "reason");
        assert_eq!(m.len(), 2);
        assert_eq!(m[&12], "NETFILTER_DROP");
        assert_eq!(parse_symbolic(text, "state")[&1], "X");
        assert!(parse_symbolic(text, "nope").is_empty());
    }

    #[test]
    fn parses_retransmit_format() {
        let f = parse_format(FORMAT).unwrap();
        assert_eq!(f["family"], (32, 2));
        assert_eq!(f["daddr"], (38, 4));
        assert_eq!(f["daddr_v6"], (58, 16));
        assert_eq!(f["skbaddr"], (8, 8));
        assert_eq!(f["sport"], (28, 2));
    }
}
