//! `zcio probe`: what this host can do, and why not.

use anyhow::{bail, Result};
use zcio::probe::{Check, Report};

/// Runs the probe and prints it.
pub fn run(ifaces: &[String], json: bool) -> Result<()> {
    for i in ifaces {
        if zcio::sys::net::if_index(i).is_none() {
            bail!("no such interface '{i}' in this network namespace (see `ip link`)");
        }
    }
    let r = Report::collect(ifaces);
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print_human(&r);
    }
    Ok(())
}

fn yn(c: &Check) -> String {
    let head = if !c.checked {
        "not checked"
    } else if c.ok {
        "yes"
    } else {
        "no"
    };
    match &c.reason {
        Some(r) => format!("{head}: {r}"),
        None => head.to_string(),
    }
}

fn print_human(r: &Report) {
    println!("kernel            {}", r.kernel);
    println!(
        "privileges        root={} CAP_NET_ADMIN={}",
        r.privileges.root, r.privileges.cap_net_admin
    );
    let u = &r.io_uring;
    match (&u.available, &u.reason) {
        (true, _) => println!(
            "io_uring          yes (sysctl io_uring_disabled={})",
            u.sysctl_disabled.map_or("?".into(), |v| v.to_string())
        ),
        (false, Some(why)) => println!("io_uring          no: {why}"),
        (false, None) => println!("io_uring          no"),
    }
    for f in &u.setup_flags {
        let state = if f.granted {
            "yes".to_string()
        } else {
            format!(
                "no: {}",
                f.reason.clone().unwrap_or_else(|| "not granted".into())
            )
        };
        println!("  setup {:<14} {state}", f.name);
    }
    if !u.opcodes.is_empty() {
        let sup = u.opcodes.iter().filter(|o| o.supported).count();
        let missing: Vec<&str> = u
            .opcodes
            .iter()
            .filter(|o| !o.supported)
            .map(|o| o.name)
            .collect();
        println!(
            "  opcodes         {sup}/{} supported{}",
            u.opcodes.len(),
            if missing.is_empty() {
                String::new()
            } else {
                format!("; missing: {}", missing.join(" "))
            }
        );
        for name in [
            "SEND_ZC",
            "SENDMSG_ZC",
            "RECV_ZC",
            "POLL_ADD",
            "RECV",
            "EPOLL_WAIT",
        ] {
            if let Some(o) = u.opcodes.iter().find(|o| o.name == name) {
                println!(
                    "    {:<13} {}",
                    name,
                    if o.supported { "yes" } else { "no" }
                );
            }
        }
    }
    if !u.features.is_empty() {
        println!("  features newer than 6.1 (how checked):");
        for f in &u.features {
            let state = if f.supported {
                "yes".to_string()
            } else {
                format!("no: {}", f.reason.clone().unwrap_or_default())
            };
            println!(
                "    {:<28} {:<5} ({}) {state}",
                f.name, f.since, f.checked_by
            );
        }
    }
    println!("zcrx device-less  {}", yn(&u.zcrx_deviceless));
    println!("MSG_ZEROCOPY");
    for z in &r.zerocopy {
        println!("  {:<15} {}", z.proto, yn(&z.check));
    }
    let l = &r.limits;
    println!(
        "limits            optmem_max={} memlock soft={} hard={}",
        l.optmem_max.map_or("?".into(), |v| v.to_string()),
        l.memlock_soft.map_or("unlimited".into(), |v| v.to_string()),
        l.memlock_hard.map_or("unlimited".into(), |v| v.to_string())
    );
    for n in &l.notes {
        println!("  {n}");
    }
    let c = &r.loopback_check;
    println!(
        "loopback zc send  {} sends, {} completed, {} COPIED",
        c.sends, c.completed, c.copied
    );
    println!("  {}", c.explanation);
    for i in &r.interfaces {
        println!(
            "interface {}      driver={} rx_queues={}",
            i.name,
            i.driver.as_deref().unwrap_or("-"),
            i.rx_queues.map_or("?".into(), |v| v.to_string())
        );
        let z = &i.zcrx;
        if z.ok {
            println!("  zcrx            yes: {}", z.explanation);
        } else {
            println!(
                "  zcrx            no{}: {}",
                i.zcrx_errno
                    .as_ref()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default(),
                z.explanation
            );
        }
        println!("  needed for zcrx on queue {}:", z.queue);
        for n in &z.needed {
            println!("    {n}");
        }
        println!("  now:");
        for n in &z.current {
            println!("    {n}");
        }
    }
    println!("NFQUEUE           {}", yn(&r.nfqueue));
    println!("capabilities (defaults, on loopback):");
    for c in &r.capabilities {
        match (&c.summary, &c.error) {
            (Some(s), _) => {
                println!("  {:<15} {}", c.name, s.path);
                for f in &s.fallbacks {
                    println!("    fallback {f}");
                }
            }
            (None, e) => println!(
                "  {:<15} not built: {}",
                c.name,
                e.as_deref().unwrap_or("?")
            ),
        }
    }
}
