//! A tracepoint's `format` file, as the kernel (or a different kernel) writes it: field
//! offsets for the tracepoint programs and the `__print_symbolic` drop-reason table.
#![no_main]
use libfuzzer_sys::fuzz_target;
use probe_user::host::tracefs::{parse_format, parse_symbolic};

fuzz_target!(|text: &str| {
    let _ = parse_format(text);
    for field in ["reason", "state", "", "REC->"] {
        let _ = parse_symbolic(text, field);
    }
});
