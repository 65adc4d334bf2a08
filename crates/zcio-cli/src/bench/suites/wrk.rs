//! What `wrk --latency` printed: requests per second, the 99th percentile latency and the
//! requests completed. Shared by the suites that drive HTTP servers with wrk (`shim`, `proxy`).

use anyhow::{anyhow, Result};

/// One wrk run's figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct WrkOut {
    pub(super) rps: f64,
    pub(super) p99_ms: f64,
    /// Requests completed (`rps * secs` if wrk did not print the count).
    pub(super) reqs: f64,
}

/// Parses wrk's report of a `secs`-second run.
pub(super) fn parse(text: &str, secs: f64) -> Result<WrkOut> {
    let rps: f64 = field_after(text, "Requests/sec:").ok_or_else(|| anyhow!("wrk: {text}"))?;
    let p99_ms = text
        .lines()
        .find(|l| l.trim_start().starts_with("99%"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(parse_ms)
        .ok_or_else(|| anyhow!("wrk p99 missing: {text}"))?;
    let reqs = text
        .lines()
        .find(|l| l.contains("requests in"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(rps * secs);
    Ok(WrkOut { rps, p99_ms, reqs })
}

fn field_after<T: std::str::FromStr>(text: &str, key: &str) -> Option<T> {
    let i = text.find(key)? + key.len();
    text[i..].split_whitespace().next()?.parse().ok()
}

/// wrk's durations: `812.00us`, `4.10ms`, `1.02s`.
fn parse_ms(v: &str) -> Option<f64> {
    let num = |s: &str| s.parse::<f64>().ok();
    if let Some(x) = v.strip_suffix("us") {
        num(x).map(|x| x / 1000.0)
    } else if let Some(x) = v.strip_suffix("ms") {
        num(x)
    } else if let Some(x) = v.strip_suffix('s') {
        num(x).map(|x| x * 1000.0)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: &str = "Running 2s test @ http://127.0.0.1:8080/file
  2 threads and 100 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.80ms  812.00us  14.03ms   80.12%
    Req/Sec    27.91k     1.20k   30.11k    71.00%
  Latency Distribution
     50%    1.71ms
     75%    2.20ms
     90%    2.71ms
     99%    4.10ms
  111020 requests in 2.00s, 131.21MB read
Requests/sec:  55510.12
Transfer/sec:     65.60MB
";

    #[test]
    fn reads_rate_p99_and_count() {
        let w = parse(OUT, 2.0).unwrap();
        assert_eq!(w.rps, 55510.12);
        assert_eq!(w.p99_ms, 4.10);
        assert_eq!(w.reqs, 111020.0);
        let us = OUT.replace("99%    4.10ms", "99%  812.00us");
        assert_eq!(parse(&us, 2.0).unwrap().p99_ms, 0.812);
        let s = OUT.replace("99%    4.10ms", "99%    1.02s");
        assert_eq!(parse(&s, 2.0).unwrap().p99_ms, 1020.0);
    }

    #[test]
    fn a_report_without_its_figures_is_an_error_that_shows_it() {
        let e = parse("unable to connect to 127.0.0.1:8080", 2.0).unwrap_err();
        assert!(e.to_string().contains("unable to connect"), "{e}");
        let no_p99 = OUT.replace("     99%    4.10ms\n", "");
        assert!(parse(&no_p99, 2.0).unwrap_err().to_string().contains("p99"));
    }
}
