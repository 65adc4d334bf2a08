//! A strict parser of Prometheus text exposition (format 0.0.4) and a scraper, for the tests of
//! `--metrics`. Stricter than Prometheus itself where zcio should never be loose: every family
//! is typed before its samples, a family's samples are contiguous, a series appears once,
//! counters are non-negative, histograms are cumulative with `+Inf` and `_count` (`_sum` may be
//! left out, as OpenMetrics allows), the
//! text ends with a newline.
#![allow(dead_code)]

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One sample line.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// One metric family.
#[derive(Debug, Clone)]
pub struct Family {
    pub name: String,
    pub kind: String,
    pub help: Option<String>,
    pub samples: Vec<Sample>,
}

/// A parsed exposition.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub families: Vec<Family>,
}

fn same_labels(have: &[(String, String)], want: &[(&str, &str)]) -> bool {
    have.len() == want.len()
        && want
            .iter()
            .all(|(k, v)| have.iter().any(|(hk, hv)| hk == k && hv == v))
}

impl Metrics {
    /// The value of the series `name` with exactly these labels (in any order).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples(name)
            .into_iter()
            .find(|s| same_labels(&s.labels, labels))
            .map(|s| s.value)
    }

    /// Every sample named `name`.
    pub fn samples(&self, name: &str) -> Vec<&Sample> {
        self.families
            .iter()
            .flat_map(|f| f.samples.iter())
            .filter(|s| s.name == name)
            .collect()
    }

    /// The type of family `name`.
    pub fn kind(&self, name: &str) -> Option<&str> {
        self.families
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.kind.as_str())
    }

    /// The label `key` of the one sample named `name` (or of its first).
    pub fn label(&self, name: &str, key: &str) -> Option<String> {
        self.samples(name).first().and_then(|s| {
            s.labels
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        })
    }
}

fn valid_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

fn valid_label(s: &str) -> bool {
    let mut c = s.chars();
    !s.starts_with("__")
        && c.next()
            .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "NaN" => Ok(f64::NAN),
        "+Inf" | "Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        _ if s.chars().all(|c| c.is_ascii_digit() || "+-.eE".contains(c)) => {
            s.parse::<f64>().map_err(|e| format!("value {s:?}: {e}"))
        }
        _ => Err(format!("value {s:?} is not a number")),
    }
}

/// Parses `name{labels} value [timestamp]`.
fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).ok_or("a sample needs a value")?;
    let name = &line[..name_end];
    if !valid_name(name) {
        return Err(format!("bad metric name {name:?}"));
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        let mut chars = r.char_indices().peekable();
        loop {
            // Label name, `=`, quoted value, then `,` or `}`.
            let start = match chars.peek() {
                Some(&(_, '}')) => {
                    let (i, _) = chars.next().unwrap();
                    rest = &r[i + 1..];
                    break;
                }
                Some(&(i, _)) => i,
                None => return Err("unterminated label set".into()),
            };
            let mut eq = None;
            for (i, c) in chars.by_ref() {
                if c == '=' {
                    eq = Some(i);
                    break;
                }
            }
            let eq = eq.ok_or("label without '='")?;
            let key = &r[start..eq];
            if !valid_label(key) {
                return Err(format!("bad label name {key:?}"));
            }
            if labels.iter().any(|(k, _): &(String, String)| k == key) {
                return Err(format!("label {key:?} twice"));
            }
            if chars.next().map(|x| x.1) != Some('"') {
                return Err(format!("label {key:?}: value not quoted"));
            }
            let mut val = String::new();
            let mut closed = false;
            while let Some((_, c)) = chars.next() {
                match c {
                    '"' => {
                        closed = true;
                        break;
                    }
                    '\\' => match chars.next().map(|x| x.1) {
                        Some('\\') => val.push('\\'),
                        Some('"') => val.push('"'),
                        Some('n') => val.push('\n'),
                        other => return Err(format!("label {key:?}: bad escape {other:?}")),
                    },
                    '\n' => return Err(format!("label {key:?}: raw newline")),
                    c => val.push(c),
                }
            }
            if !closed {
                return Err(format!("label {key:?}: unterminated value"));
            }
            labels.push((key.to_string(), val));
            match chars.next() {
                Some((_, ',')) => {}
                Some((i, '}')) => {
                    rest = &r[i + 1..];
                    break;
                }
                other => return Err(format!("after label {key:?}: {other:?}")),
            }
        }
    }
    let rest = rest
        .strip_prefix(' ')
        .ok_or_else(|| format!("{name}: no space before the value"))?;
    let mut f = rest.split(' ');
    let value = parse_value(f.next().unwrap_or(""))?;
    if let Some(ts) = f.next() {
        ts.parse::<i64>()
            .map_err(|_| format!("{name}: bad timestamp {ts:?}"))?;
    }
    if f.next().is_some() {
        return Err(format!("{name}: trailing text"));
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// The family a sample named `name` belongs to, given the declared types.
fn family_of<'a>(name: &'a str, types: &[(String, String)]) -> &'a str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            let t = types
                .iter()
                .find(|(n, _)| n == base)
                .map(|(_, t)| t.as_str());
            match (suffix, t) {
                (_, Some("histogram")) => return base,
                ("_sum" | "_count", Some("summary")) => return base,
                _ => {}
            }
        }
    }
    name
}

fn check_histogram(f: &Family) -> Result<(), String> {
    // Group by the labels other than `le`.
    type Group<'a> = (Vec<(String, String)>, Vec<&'a Sample>);
    let mut groups: Vec<Group<'_>> = Vec::new();
    for s in &f.samples {
        let mut key: Vec<(String, String)> = s
            .labels
            .iter()
            .filter(|(k, _)| k != "le")
            .cloned()
            .collect();
        key.sort();
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some(g) => g.1.push(s),
            None => groups.push((key, vec![s])),
        }
    }
    for (key, ss) in groups {
        let mut last = (f64::NEG_INFINITY, 0.0);
        let mut inf = None;
        let mut count = None;
        for s in ss {
            if s.name.ends_with("_bucket") {
                let le = s
                    .labels
                    .iter()
                    .find(|(k, _)| k == "le")
                    .ok_or_else(|| format!("{}: bucket without le", f.name))?;
                let le = parse_value(&le.1)?;
                if le <= last.0 || s.value < last.1 {
                    return Err(format!("{} {key:?}: buckets not cumulative", f.name));
                }
                last = (le, s.value);
                if le.is_infinite() {
                    inf = Some(s.value);
                }
            } else if s.name.ends_with("_count") {
                count = Some(s.value);
            }
        }
        let inf = inf.ok_or_else(|| format!("{} {key:?}: no +Inf bucket", f.name))?;
        if count != Some(inf) {
            return Err(format!(
                "{} {key:?}: _count {count:?} != +Inf bucket {inf}",
                f.name
            ));
        }
    }
    Ok(())
}

/// Parses `text` strictly.
pub fn parse(text: &str) -> Result<Metrics, String> {
    if !text.is_empty() && !text.ends_with('\n') {
        return Err("the exposition does not end with a newline".into());
    }
    let mut m = Metrics::default();
    let mut types: Vec<(String, String)> = Vec::new();
    let mut closed: HashSet<String> = HashSet::new();
    let mut series: HashSet<String> = HashSet::new();
    let mut current: Option<String> = None;
    let mut enter = |m: &mut Metrics, name: &str, current: &mut Option<String>| {
        if current.as_deref() == Some(name) {
            return Ok(());
        }
        if closed.contains(name) {
            return Err(format!(
                "family {name} is split (its lines are not together)"
            ));
        }
        if let Some(c) = current.take() {
            closed.insert(c);
        }
        *current = Some(name.to_string());
        if !m.families.iter().any(|f| f.name == name) {
            m.families.push(Family {
                name: name.to_string(),
                kind: "untyped".into(),
                help: None,
                samples: Vec::new(),
            });
        }
        Ok(())
    };
    for (no, line) in text.lines().enumerate() {
        let at = |e: String| format!("line {}: {e}: {line:?}", no + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(c) = line.strip_prefix('#') {
            let c = c.trim_start();
            let (what, rest) = c.split_once(' ').unwrap_or((c, ""));
            if what != "HELP" && what != "TYPE" {
                continue;
            }
            let (name, arg) = rest.split_once(' ').unwrap_or((rest, ""));
            if !valid_name(name) {
                return Err(at(format!("bad metric name {name:?}")));
            }
            enter(&mut m, name, &mut current).map_err(at)?;
            let f = m.families.iter_mut().find(|f| f.name == name).unwrap();
            if !f.samples.is_empty() {
                return Err(at(format!("{what} after samples of {name}")));
            }
            if what == "HELP" {
                if f.help.is_some() {
                    return Err(at(format!("HELP twice for {name}")));
                }
                let mut h = String::new();
                let mut cs = arg.chars();
                while let Some(ch) = cs.next() {
                    if ch == '\\' {
                        match cs.next() {
                            Some('\\') => h.push('\\'),
                            Some('n') => h.push('\n'),
                            other => return Err(at(format!("bad escape in HELP: {other:?}"))),
                        }
                    } else {
                        h.push(ch);
                    }
                }
                f.help = Some(h);
            } else {
                if types.iter().any(|(n, _)| n == name) {
                    return Err(at(format!("TYPE twice for {name}")));
                }
                if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&arg) {
                    return Err(at(format!("unknown type {arg:?}")));
                }
                f.kind = arg.to_string();
                types.push((name.to_string(), arg.to_string()));
            }
            continue;
        }
        let s = parse_sample(line).map_err(at)?;
        let fam = family_of(&s.name, &types).to_string();
        enter(&mut m, &fam, &mut current).map_err(at)?;
        let mut key: Vec<&(String, String)> = s.labels.iter().collect();
        key.sort();
        if !series.insert(format!("{}{key:?}", s.name)) {
            return Err(at("the same series twice".into()));
        }
        let f = m.families.iter_mut().find(|f| f.name == fam).unwrap();
        match f.kind.as_str() {
            "counter" if s.value.is_nan() || s.value < 0.0 => {
                return Err(at("a counter below zero or NaN".into()));
            }
            "counter" | "gauge" | "untyped" if s.name != fam => {
                return Err(at(format!("{} in family {fam}", s.name)));
            }
            "histogram" if s.name == fam => {
                return Err(at("a histogram sample without _bucket/_sum/_count".into()));
            }
            _ => {}
        }
        f.samples.push(s);
    }
    for f in &m.families {
        if f.samples.is_empty() {
            return Err(format!("family {} has no samples", f.name));
        }
        if f.kind == "histogram" {
            check_histogram(f)?;
        }
    }
    Ok(m)
}

/// `GET /metrics` from `addr`: the body, after checking the status, the content type and
/// the length.
pub fn scrape(addr: SocketAddr) -> Result<String, String> {
    let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connecting to {addr}: {e}"))?;
    c.set_read_timeout(Some(Duration::from_secs(10))).ok();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: zcio\r\nAccept: text/plain\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut r = String::new();
    c.read_to_string(&mut r).map_err(|e| e.to_string())?;
    let (head, body) = r.split_once("\r\n\r\n").ok_or("no end of the head")?;
    if !head.starts_with("HTTP/1.1 200 ") {
        return Err(format!("status: {head}"));
    }
    let header = |k: &str| {
        head.lines()
            .find_map(|l| {
                l.split_once(": ")
                    .filter(|(n, _)| n.eq_ignore_ascii_case(k))
            })
            .map(|(_, v)| v.to_string())
    };
    let ctype = header("Content-Type").unwrap_or_default();
    if !ctype.starts_with("text/plain; version=0.0.4") {
        return Err(format!("content type {ctype:?}"));
    }
    if header("Content-Length").and_then(|l| l.parse::<usize>().ok()) != Some(body.len()) {
        return Err("Content-Length does not match the body".into());
    }
    Ok(body.to_string())
}

/// Checks `text` with `promtool check metrics` when promtool is installed (`scripts/deps`
/// installs Debian's `prometheus` package); `Ok(false)` when it is not.
pub fn promtool_check(text: &str) -> Result<bool, String> {
    use std::process::{Command, Stdio};
    let mut child = match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e.to_string()),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .map_err(|e| e.to_string())?;
    let o = child.wait_with_output().map_err(|e| e.to_string())?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    if !o.status.success() || !said.trim().is_empty() {
        return Err(format!("promtool check metrics: {said}"));
    }
    Ok(true)
}
