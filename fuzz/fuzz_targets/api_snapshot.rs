//! What `probe record` and `probe top` read from a daemon, which may be another version or
//! not a probe at all: the HTTP response, the snapshot JSON, and top's whole view of it
//! (frame, text output, terminal drawing).
#![no_main]
use libfuzzer_sys::fuzz_target;
use probe_user::{apiclient::parse_response, record::client, top};
use ratatui::{backend::TestBackend, Terminal};

fn view(body: &[u8]) {
    let _ = serde_json::from_slice::<client::Snapshot>(body);
    let Ok(s) = serde_json::from_slice::<top::model::Snapshot>(body) else {
        return;
    };
    let mut app = top::app::App::new("http://127.0.0.1:9464");
    // Twice: the second tick rates against the first.
    app.on_snapshot(s.clone());
    app.on_snapshot(s);
    let _ = top::text::render(&app);
    let mut term = Terminal::new(TestBackend::new(120, 40)).expect("test backend");
    term.draw(|f| top::ui::draw(f, &app)).expect("draw");
}

fuzz_target!(|data: &[u8]| {
    if let Ok((_status, body)) = parse_response(data) {
        view(&body);
    }
    // The body alone too: valid HTTP around fuzzed JSON is too rare to find by mutation.
    view(data);
});
