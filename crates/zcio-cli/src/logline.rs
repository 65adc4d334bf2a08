//! A daemon's log on stderr: one line per event, as text (`zcio CMD: message`, the default)
//! or as one JSON object per line (`--log-format json`):
//! `{"ts": <unix seconds>, "level": "info"|"warn"|"error", "cmd": "proxy", "event": "<name>",
//! "msg": "<the text line's message>", ...the event's own fields}`.
//! Each line is written with one `write` under the stderr lock, so threads never interleave.

use std::io::Write;

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `zcio CMD: message`.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// How much an event matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Normal operation (start, reload, stop).
    Info,
    /// Something failed for one connection or one request; the daemon goes on.
    Warn,
    /// Something the operator has to fix (a reload refused); the daemon goes on as before.
    Error,
}

impl Level {
    fn name(self) -> &'static str {
        match self {
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }
}

/// A command's log.
#[derive(Debug, Clone, Copy)]
pub struct Log {
    cmd: &'static str,
    format: LogFormat,
}

impl Log {
    /// The log of `zcio CMD`.
    pub fn new(cmd: &'static str, format: LogFormat) -> Self {
        Self { cmd, format }
    }

    /// One event: `msg` is the text line; `fields` (a JSON object, or null) add to the JSON
    /// line.
    pub fn event(&self, level: Level, event: &str, msg: &str, fields: serde_json::Value) {
        let line = self.line(level, event, msg, fields);
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn line(&self, level: Level, event: &str, msg: &str, fields: serde_json::Value) -> String {
        match self.format {
            LogFormat::Text => {
                let mut out = String::new();
                // A message of several lines stays one event per line.
                for l in msg.lines() {
                    out.push_str(&format!("zcio {}: {l}\n", self.cmd));
                }
                out
            }
            LogFormat::Json => {
                let ts = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64());
                let mut o = serde_json::json!({
                    "ts": ts,
                    "level": level.name(),
                    "cmd": self.cmd,
                    "event": event,
                    "msg": msg,
                });
                if let (Some(o), serde_json::Value::Object(f)) = (o.as_object_mut(), fields) {
                    for (k, v) in f {
                        o.entry(k).or_insert(v);
                    }
                }
                format!("{o}\n")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_line_is_one_object_with_the_fields_and_a_text_line_is_prefixed() {
        let j = Log::new("proxy", LogFormat::Json);
        let l = j.line(
            Level::Warn,
            "pair_ended",
            "a -> b: Reset\nsecond line",
            serde_json::json!({"kind": "Reset", "msg": "not overwritten"}),
        );
        assert_eq!(l.matches('\n').count(), 1, "{l}");
        let v: serde_json::Value = serde_json::from_str(&l).unwrap();
        assert_eq!(v["level"], "warn");
        assert_eq!(v["event"], "pair_ended");
        assert_eq!(v["cmd"], "proxy");
        assert_eq!(v["kind"], "Reset");
        assert_eq!(v["msg"], "a -> b: Reset\nsecond line");
        assert!(v["ts"].as_f64().unwrap() > 1.6e9);
        let t = Log::new("proxy", LogFormat::Text);
        assert_eq!(
            t.line(Level::Info, "x", "one\ntwo", serde_json::Value::Null),
            "zcio proxy: one\nzcio proxy: two\n"
        );
    }
}
