//! The `zcio` command: probe, perf, bench, proxy, nfq, nflog, audit, conntrack events, netlink dump, hosts.

mod audit;
mod bench;
mod ctevents;
mod hosts;
mod logline;
mod metrics;
mod nflog;
mod nfq;
mod nldump;
mod perf;
mod privs;
mod probe;
mod proxy;
mod util;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "zcio",
    version,
    about = "Zero-copy, low-syscall network I/O for Linux"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Report what this host, its interfaces and sockets can do, and why not.
    Probe {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Interfaces to check for zero-copy receive (zcrx); repeatable.
        #[arg(long = "iface")]
        ifaces: Vec<String>,
    },
    /// Test hosts in network namespaces (198.18.0.0/15, 2001:db8::/32), for experiments.
    Hosts {
        #[command(subcommand)]
        cmd: HostsCmd,
    },
    /// Throughput tool for the send paths: `zcio perf server` and `zcio perf client`.
    #[command(subcommand)]
    Perf(perf::PerfCmd),
    /// Run benchmark suites (baseline and zcio alternating) and write results.json + report.html.
    Bench {
        /// Suites to run (default: all). `zcio bench --list` shows them.
        suites: Vec<String>,
        /// Smoke run: one round of each case (CI's smoke run).
        #[arg(long, conflicts_with = "full")]
        quick: bool,
        /// Larger sizes (1,000-connection cases), longer runs, 7 rounds. Without `--quick` or
        /// `--full`: the quick sizes, 3 rounds (about 15 minutes on 2 cores).
        #[arg(long)]
        full: bool,
        /// Output directory.
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
        /// List the suites and exit.
        #[arg(long)]
        list: bool,
        /// Run the suites that cross a network (tx, notify, rx) against `zcio perf server`
        /// on this host (`HOST` or `HOST:PORT`): a two-host run.
        #[arg(long, value_name = "HOST")]
        peer: Option<String>,
    },
    /// TCP proxy on one ring per thread: received buffers forwarded with zero-copy send.
    Proxy(proxy::ProxyArgs),
    /// NFQUEUE filter daemon: accept all, drop by protocol/port, count; batch verdicts.
    Nfq(nfq::NfqArgs),
    /// NFLOG packets to pcapng/pcap (file, rotated, or stdout) or text lines, with loss
    /// accounting.
    Nflog(nflog::NflogArgs),
    /// Audit events as the audit daemon (or beside one): JSON lines or auditd's log format,
    /// the kernel's audit status at start and a loss summary at exit.
    Audit(audit::AuditArgs),
    /// Conntrack tools.
    Conntrack {
        #[command(subcommand)]
        cmd: ConntrackCmd,
    },
    /// Netlink tools.
    Netlink {
        #[command(subcommand)]
        cmd: NetlinkCmd,
    },
    /// Shell completions for zcio, on stdout (the Debian package installs bash, zsh and fish
    /// ones).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Writes the man pages, zcio(1) and one per subcommand (zcio-nfq(1), ...), generated from
    /// these definitions, into DIR (scripts/package runs it).
    #[command(hide = true)]
    Man {
        /// Output directory.
        dir: PathBuf,
    },
}

#[derive(Subcommand)]
enum ConntrackCmd {
    /// Conntrack events, one line each as `conntrack -E` prints them (or JSON), with a loss
    /// summary.
    Events(ctevents::EventsArgs),
}

#[derive(Subcommand)]
enum NetlinkCmd {
    /// Dump routes, links, neighbours or addresses through the frame ring.
    Dump(nldump::DumpArgs),
}

#[derive(Subcommand)]
enum HostsCmd {
    /// Create a host pair and a sink host, print them, remove them when done.
    Up {
        /// Keep them this many seconds (default: until Enter).
        #[arg(long, default_value_t = 0)]
        seconds: u64,
    },
    /// Remove namespaces left by killed zcio runs.
    Cleanup,
}

fn main() {
    // The receiver process of `zcio bench tx`'s scale case (not a command of its own).
    if let Ok(spec) = std::env::var(bench::suites::tx_scale::DRAIN_ENV) {
        std::process::exit(bench::suites::tx_scale::drain_child(&spec));
    }
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("zcio: error: {e:#}");
        std::process::exit(1);
    }
}

/// The pages of `cmd` (named `name`) and of its visible subcommands, as (file name, roff).
fn man_pages(cmd: &clap::Command, name: &str, out: &mut Vec<(String, Vec<u8>)>) -> Result<()> {
    let cmd = cmd
        .clone()
        .name(name.to_string())
        .bin_name(name.replace('-', " "));
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut page)?;
    let mut see: Vec<String> = Vec::new();
    if name != "zcio" {
        see.push("zcio(1)".into());
    }
    for s in cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        see.push(format!("{name}-{}(1)", s.get_name()));
    }
    see.extend(["zcio-units(7)".into(), "libzcio(3)".into()]);
    page.extend_from_slice(
        format!(
            ".SH \"SEE ALSO\"\n{}\n",
            see.iter()
                .map(|s| {
                    let (n, sec) = s.trim_end_matches(')').split_once('(').unwrap_or((s, "1"));
                    format!(".BR {n} ({sec})")
                })
                .collect::<Vec<_>>()
                .join(",\n")
        )
        .as_bytes(),
    );
    out.push((format!("{name}.1"), page));
    for s in cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        man_pages(s, &format!("{name}-{}", s.get_name()), out)?;
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "zcio", &mut std::io::stdout());
            Ok(())
        }
        Cmd::Man { dir } => {
            use anyhow::Context;
            use clap::CommandFactory;
            let mut cmd = Cli::command();
            cmd.build();
            let mut pages = Vec::new();
            man_pages(&cmd, "zcio", &mut pages)?;
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for (name, page) in pages {
                let p = dir.join(&name);
                std::fs::write(&p, page).with_context(|| format!("writing {}", p.display()))?;
                println!("{}", p.display());
            }
            Ok(())
        }
        Cmd::Probe { json, ifaces } => probe::run(&ifaces, json),
        Cmd::Hosts {
            cmd: HostsCmd::Up { seconds },
        } => hosts::up(seconds),
        Cmd::Hosts {
            cmd: HostsCmd::Cleanup,
        } => hosts::cleanup(),
        Cmd::Perf(p) => perf::run(p),
        Cmd::Nfq(a) => nfq::run(a),
        Cmd::Proxy(a) => proxy::run(a),
        Cmd::Nflog(a) => nflog::run(a),
        Cmd::Audit(a) => audit::run(a),
        Cmd::Conntrack {
            cmd: ConntrackCmd::Events(a),
        } => ctevents::run(a),
        Cmd::Netlink {
            cmd: NetlinkCmd::Dump(a),
        } => nldump::run(a),
        Cmd::Bench {
            suites,
            quick,
            full,
            out,
            list,
            peer,
        } => {
            if list {
                for s in bench::suites::all() {
                    println!("{:<10} {}", s.name(), s.about());
                }
                return Ok(());
            }
            let mode = if quick {
                bench::Mode::Quick
            } else if full {
                bench::Mode::Full
            } else {
                bench::Mode::Default
            };
            bench::run(&suites, mode, out.clone(), peer.as_deref())?;
            println!(
                "\nwrote {} and {}",
                out.join("results.json").display(),
                out.join("report.html").display()
            );
            Ok(())
        }
    }
}
