//! Audit records and events, without a kernel: the record parser (type, the
//! `audit(sec.msec:serial)` header, `key=value` fields with hex-encoded values decoded) and the
//! grouper that makes events of records by serial (see [`super::Audit`] for the rules).

use super::msg::{NlMsg, ParseError};
use crate::sys::audit::*;
use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// One audit record, borrowed from its frame (or from its [`AuditEvent`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditRecord<'a> {
    /// Record type (`AUDIT_SYSCALL` = 1300, `AUDIT_PATH` = 1302, ...; [`type_name`]).
    pub ty: u16,
    /// Seconds of the event's time stamp (Unix time).
    pub sec: u64,
    /// Milliseconds of the event's time stamp.
    pub msec: u16,
    /// The event's serial number: every record of one event has it.
    pub serial: u64,
    /// The fields after `audit(...): `, as the kernel wrote them.
    pub body: &'a [u8],
    /// The whole text, `audit(...): ` header included (what auditd writes after `msg=`).
    pub text: &'a [u8],
}

fn digits(b: &[u8]) -> Option<(u64, &[u8])> {
    let n = b.iter().take_while(|c| c.is_ascii_digit()).count();
    if n == 0 || n > 19 {
        return None;
    }
    let v = std::str::from_utf8(&b[..n]).ok()?.parse().ok()?;
    Some((v, &b[n..]))
}

fn header(text: &[u8]) -> Option<(u64, u16, u64, &[u8])> {
    let rest = text.strip_prefix(b"audit(")?;
    let (sec, rest) = digits(rest)?;
    let rest = rest.strip_prefix(b".")?;
    let (msec, rest) = digits(rest)?;
    let rest = rest.strip_prefix(b":")?;
    let (serial, rest) = digits(rest)?;
    let rest = rest.strip_prefix(b"):")?;
    let body = rest.strip_prefix(b" ").unwrap_or(rest);
    Some((sec, u16::try_from(msec).ok()?, serial, body))
}

impl<'a> AuditRecord<'a> {
    /// Parses a record's text (`audit(1700000000.123:42): key=value ...`; trailing NULs and
    /// newlines are not part of it).
    pub fn parse_text(ty: u16, text: &'a [u8]) -> Result<Self, ParseError> {
        let end = text
            .iter()
            .rposition(|&c| c != 0 && c != b'\n')
            .map_or(0, |i| i + 1);
        let text = &text[..end];
        let (sec, msec, serial, body) =
            header(text).ok_or(ParseError::Missing("audit(sec.msec:serial) record header"))?;
        Ok(Self {
            ty,
            sec,
            msec,
            serial,
            body,
            text,
        })
    }

    /// Parses a record from its netlink message: `Ok(None)` for a message that is not a record
    /// (a reply to a request, `NLMSG_DONE`).
    pub fn parse(m: &NlMsg<'a>) -> Result<Option<Self>, ParseError> {
        if m.ty < AUDIT_FIRST_USER_MSG || m.ty == AUDIT_REPLACE {
            // Replies to requests; the kernel's liveness probe (a pid, no text).
            return Ok(None);
        }
        Self::parse_text(m.ty, m.payload).map(Some)
    }

    /// The fields, in order (see [`Fields`]).
    pub fn fields(&self) -> Fields<'a> {
        Fields {
            rest: self.body,
            ty: self.ty,
        }
    }

    /// The first field named `key`, decoded.
    pub fn field(&self, key: &str) -> Option<Cow<'a, [u8]>> {
        self.fields()
            .find(|f| f.key == key.as_bytes())
            .map(|f| f.value())
    }
}

/// One `key=value` field of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field<'a> {
    /// The key.
    pub key: &'a [u8],
    /// The value as written: quotes kept, hex not decoded.
    pub raw: &'a [u8],
    /// Whether the kernel may have hex-encoded this field (it does so with untrusted strings
    /// that hold a space, a quote or a control character: `proctitle`, `execve` arguments,
    /// `name`, `comm`, `exe`, `cwd`, ...).
    pub untrusted: bool,
}

/// Keys whose values the kernel writes with `audit_log_untrustedstring` (or as hex always,
/// `proctitle`): quoted when printable, hex otherwise.
fn untrusted_key(ty: u16, key: &[u8]) -> bool {
    const KEYS: &[&[u8]] = &[
        b"proctitle",
        b"name",
        b"comm",
        b"exe",
        b"cwd",
        b"path",
        b"key",
        b"data",
        b"ocomm",
        b"watch",
        b"dir",
        b"old_prom",
        b"cmd",
        b"vm",
        b"root_dir",
    ];
    if KEYS.contains(&key) {
        return true;
    }
    // EXECVE arguments: a0, a1, ..., and a0[0] for long ones.
    const EXECVE: u16 = 1309;
    ty == EXECVE
        && key.first() == Some(&b'a')
        && key.len() > 1
        && key[1..]
            .iter()
            .all(|c| c.is_ascii_digit() || *c == b'[' || *c == b']')
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'A'..=b'F' => Some(c - b'A' + 10),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// Decodes an even-length hex string; `None` if it is not one.
pub fn decode_hex(s: &[u8]) -> Option<Vec<u8>> {
    if s.is_empty() || s.len() % 2 != 0 {
        return None;
    }
    s.chunks(2)
        .map(|p| Some(hex_val(p[0])? << 4 | hex_val(p[1])?))
        .collect()
}

impl<'a> Field<'a> {
    /// The value: quotes removed; an untrusted field written as hex, decoded (`proctitle`'s
    /// NULs between arguments kept); anything else as written.
    pub fn value(&self) -> Cow<'a, [u8]> {
        let r = self.raw;
        if r.len() >= 2
            && ((r[0] == b'"' && r[r.len() - 1] == b'"')
                || (r[0] == b'\'' && r[r.len() - 1] == b'\''))
        {
            return Cow::Borrowed(&r[1..r.len() - 1]);
        }
        if self.untrusted && r != b"(null)" && r != b"?" {
            if let Some(v) = decode_hex(r) {
                return Cow::Owned(v);
            }
        }
        Cow::Borrowed(r)
    }
}

/// The fields of a record: space-separated `key=value`, values either `"quoted"` (no quote
/// inside: the kernel hex-encodes those), `'single quoted'` (user messages: `msg='...'`, which
/// may hold spaces and `=`), or bare. A word without `=` is a field with an empty key.
#[derive(Debug, Clone)]
pub struct Fields<'a> {
    rest: &'a [u8],
    ty: u16,
}

impl<'a> Iterator for Fields<'a> {
    type Item = Field<'a>;
    fn next(&mut self) -> Option<Field<'a>> {
        let s = self.rest;
        let start = s.iter().position(|&c| c != b' ')?;
        let s = &s[start..];
        let eq = s.iter().position(|&c| c == b'=' || c == b' ');
        let (key, vstart) = match eq {
            Some(i) if s[i] == b'=' => (&s[..i], i + 1),
            _ => (&s[..0], 0),
        };
        let v = &s[vstart..];
        let len = match v.first() {
            Some(&q @ (b'"' | b'\'')) => v[1..]
                .iter()
                .position(|&c| c == q)
                .map_or(v.len(), |i| i + 2),
            _ => v.iter().position(|&c| c == b' ').unwrap_or(v.len()),
        };
        self.rest = &v[len..];
        Some(Field {
            key,
            raw: &v[..len],
            untrusted: untrusted_key(self.ty, key),
        })
    }
}

/// The name auditd gives a record type (`SYSCALL`, `PATH`, ...), `None` for one this table
/// does not know (auditd then writes `UNKNOWN[n]`).
pub fn type_name(ty: u16) -> Option<&'static str> {
    Some(match ty {
        1100 => "USER",
        1101 => "USER_AUTH",
        1102 => "USER_ACCT",
        1103 => "USER_MGMT",
        1104 => "CRED_ACQ",
        1105 => "CRED_DISP",
        1106 => "USER_START",
        1107 => "USER_END",
        1108 => "USER_AVC",
        1109 => "USER_CHAUTHTOK",
        1110 => "USER_ERR",
        1111 => "CRED_REFR",
        1112 => "USER_LOGIN",
        1113 => "USER_LOGOUT",
        1114 => "ADD_USER",
        1115 => "DEL_USER",
        1116 => "ADD_GROUP",
        1117 => "DEL_GROUP",
        1118 => "DAC_CHECK",
        1119 => "CHGRP_ID",
        1120 => "TEST",
        1121 => "TRUSTED_APP",
        1122 => "USER_SELINUX_ERR",
        1123 => "USER_CMD",
        1124 => "USER_TTY",
        1125 => "CHUSER_ID",
        1126 => "GRP_AUTH",
        1127 => "SYSTEM_BOOT",
        1128 => "SYSTEM_SHUTDOWN",
        1129 => "SYSTEM_RUNLEVEL",
        1130 => "SERVICE_START",
        1131 => "SERVICE_STOP",
        1132 => "GRP_MGMT",
        1133 => "GRP_CHAUTHTOK",
        1134 => "MAC_CHECK",
        1135 => "ACCT_LOCK",
        1136 => "ACCT_UNLOCK",
        1137 => "USER_DEVICE",
        1138 => "SOFTWARE_UPDATE",
        1200 => "DAEMON_START",
        1201 => "DAEMON_END",
        1202 => "DAEMON_ABORT",
        1203 => "DAEMON_CONFIG",
        1204 => "DAEMON_RECONFIG",
        1205 => "DAEMON_ROTATE",
        1206 => "DAEMON_RESUME",
        1207 => "DAEMON_ACCEPT",
        1208 => "DAEMON_CLOSE",
        1209 => "DAEMON_ERR",
        1300 => "SYSCALL",
        1302 => "PATH",
        1303 => "IPC",
        1304 => "SOCKETCALL",
        1305 => "CONFIG_CHANGE",
        1306 => "SOCKADDR",
        1307 => "CWD",
        1309 => "EXECVE",
        1311 => "IPC_SET_PERM",
        1312 => "MQ_OPEN",
        1313 => "MQ_SENDRECV",
        1314 => "MQ_NOTIFY",
        1315 => "MQ_GETSETATTR",
        1316 => "KERNEL_OTHER",
        1317 => "FD_PAIR",
        1318 => "OBJ_PID",
        1319 => "TTY",
        1320 => "EOE",
        1321 => "BPRM_FCAPS",
        1322 => "CAPSET",
        1323 => "MMAP",
        1324 => "NETFILTER_PKT",
        1325 => "NETFILTER_CFG",
        1326 => "SECCOMP",
        1327 => "PROCTITLE",
        1328 => "FEATURE_CHANGE",
        1329 => "REPLACE",
        1330 => "KERN_MODULE",
        1331 => "FANOTIFY",
        1332 => "TIME_INJOFFSET",
        1333 => "TIME_ADJNTPVAL",
        1334 => "BPF",
        1335 => "EVENT_LISTENER",
        1336 => "URINGOP",
        1337 => "OPENAT2",
        1338 => "DM_CTRL",
        1339 => "DM_EVENT",
        1400 => "AVC",
        1401 => "SELINUX_ERR",
        1402 => "AVC_PATH",
        1403 => "MAC_POLICY_LOAD",
        1404 => "MAC_STATUS",
        1405 => "MAC_CONFIG_CHANGE",
        1406 => "MAC_UNLBL_ALLOW",
        1407 => "MAC_CIPSOV4_ADD",
        1408 => "MAC_CIPSOV4_DEL",
        1409 => "MAC_MAP_ADD",
        1410 => "MAC_MAP_DEL",
        1411 => "MAC_IPSEC_ADDSA",
        1412 => "MAC_IPSEC_DELSA",
        1413 => "MAC_IPSEC_ADDSPD",
        1414 => "MAC_IPSEC_DELSPD",
        1415 => "MAC_IPSEC_EVENT",
        1416 => "MAC_UNLBL_STCADD",
        1417 => "MAC_UNLBL_STCDEL",
        1418 => "MAC_CALIPSO_ADD",
        1419 => "MAC_CALIPSO_DEL",
        1420 => "MAC_TASK_CONTEXTS",
        1421 => "MAC_OBJ_CONTEXTS",
        1700 => "ANOM_PROMISCUOUS",
        1701 => "ANOM_ABEND",
        1702 => "ANOM_LINK",
        1703 => "ANOM_CREAT",
        1800 => "INTEGRITY_DATA",
        1801 => "INTEGRITY_METADATA",
        1802 => "INTEGRITY_STATUS",
        1803 => "INTEGRITY_HASH",
        1804 => "INTEGRITY_PCR",
        1805 => "INTEGRITY_RULE",
        1806 => "INTEGRITY_EVM_XATTR",
        1807 => "INTEGRITY_POLICY_RULE",
        2000 => "KERNEL",
        2100 => "ANOM_LOGIN_FAILURES",
        2101 => "ANOM_LOGIN_TIME",
        2102 => "ANOM_LOGIN_SESSIONS",
        2103 => "ANOM_LOGIN_ACCT",
        2104 => "ANOM_LOGIN_LOCATION",
        2105 => "ANOM_MAX_DAC",
        2106 => "ANOM_MAX_MAC",
        2107 => "ANOM_AMTU_FAIL",
        2108 => "ANOM_RBAC_FAIL",
        2109 => "ANOM_RBAC_INTEGRITY_FAIL",
        2110 => "ANOM_CRYPTO_FAIL",
        2111 => "ANOM_ACCESS_FS",
        2112 => "ANOM_EXEC",
        2113 => "ANOM_MK_EXEC",
        2114 => "ANOM_ADD_ACCT",
        2115 => "ANOM_DEL_ACCT",
        2116 => "ANOM_MOD_ACCT",
        2117 => "ANOM_ROOT_TRANS",
        2118 => "ANOM_LOGIN_SERVICE",
        2119 => "ANOM_LOGIN_ROOT",
        2120 => "ANOM_ORIGIN_FAILURES",
        2121 => "ANOM_SESSION",
        2200 => "RESP_ANOMALY",
        2201 => "RESP_ALERT",
        2202 => "RESP_KILL_PROC",
        2203 => "RESP_TERM_ACCESS",
        2204 => "RESP_ACCT_REMOTE",
        2205 => "RESP_ACCT_LOCK_TIMED",
        2206 => "RESP_ACCT_UNLOCK_TIMED",
        2207 => "RESP_ACCT_LOCK",
        2208 => "RESP_TERM_LOCK",
        2209 => "RESP_SEBOOL",
        2210 => "RESP_EXEC",
        2211 => "RESP_SINGLE",
        2212 => "RESP_HALT",
        2213 => "RESP_ORIGIN_BLOCK",
        2214 => "RESP_ORIGIN_BLOCK_TIMED",
        2215 => "RESP_ORIGIN_UNBLOCK_TIMED",
        2300 => "USER_ROLE_CHANGE",
        2301 => "ROLE_ASSIGN",
        2302 => "ROLE_REMOVE",
        2303 => "LABEL_OVERRIDE",
        2304 => "LABEL_LEVEL_CHANGE",
        2305 => "USER_LABELED_EXPORT",
        2306 => "USER_UNLABELED_EXPORT",
        2307 => "DEV_ALLOC",
        2308 => "DEV_DEALLOC",
        2309 => "FS_RELABEL",
        2310 => "USER_MAC_POLICY_LOAD",
        2311 => "ROLE_MODIFY",
        2312 => "USER_MAC_CONFIG_CHANGE",
        2313 => "USER_MAC_STATUS",
        2400 => "CRYPTO_TEST_USER",
        2401 => "CRYPTO_PARAM_CHANGE_USER",
        2402 => "CRYPTO_LOGIN",
        2403 => "CRYPTO_LOGOUT",
        2404 => "CRYPTO_KEY_USER",
        2405 => "CRYPTO_FAILURE_USER",
        2406 => "CRYPTO_REPLAY_USER",
        2407 => "CRYPTO_SESSION",
        2408 => "CRYPTO_IKE_SA",
        2409 => "CRYPTO_IPSEC_SA",
        2500 => "VIRT_CONTROL",
        2501 => "VIRT_RESOURCE",
        2502 => "VIRT_MACHINE_ID",
        2503 => "VIRT_INTEGRITY_CHECK",
        2504 => "VIRT_CREATE",
        2505 => "VIRT_DESTROY",
        2506 => "VIRT_MIGRATE_IN",
        2507 => "VIRT_MIGRATE_OUT",
        _ => return None,
    })
}

/// Whether a record of this type is an event of its own: the kernel sends no end-of-event
/// record after it (user-space messages relayed by the kernel, daemon messages, the
/// "initialized" record).
fn standalone(ty: u16) -> bool {
    (AUDIT_FIRST_USER_MSG..=1299).contains(&ty)
        || ty == AUDIT_KERNEL
        || (AUDIT_FIRST_USER_MSG2..=AUDIT_LAST_USER_MSG2).contains(&ty)
}

/// How an event was closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventEnd {
    /// The kernel's end-of-event record arrived.
    Eoe,
    /// A single-record event (a type the kernel sends no end-of-event record after).
    Single,
    /// No end-of-event record within the wait ([`super::AuditConfig::event_wait`]), or the
    /// consumer closed first.
    Wait,
}

impl EventEnd {
    /// `eoe`, `single` or `wait` (as serialised).
    pub fn as_str(self) -> &'static str {
        match self {
            EventEnd::Eoe => "eoe",
            EventEnd::Single => "single",
            EventEnd::Wait => "wait",
        }
    }
}

/// One audit event: its records in arrival order (the end-of-event record not among them).
/// The records' bytes are copied out of the frames, once, into one buffer per event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEvent {
    /// The serial number every record of the event has.
    pub serial: u64,
    /// Time stamp: seconds.
    pub sec: u64,
    /// Time stamp: milliseconds.
    pub msec: u16,
    /// How the event was closed.
    pub end: EventEnd,
    buf: Vec<u8>,
    recs: Vec<(u16, u32, u32)>,
}

impl AuditEvent {
    /// The records, in arrival order.
    pub fn records(&self) -> impl Iterator<Item = AuditRecord<'_>> + '_ {
        self.recs.iter().map(move |&(ty, a, b)| {
            let text = &self.buf[a as usize..b as usize];
            AuditRecord::parse_text(ty, text).expect("a stored record parsed before")
        })
    }

    /// Records in the event.
    pub fn len(&self) -> usize {
        self.recs.len()
    }

    /// Whether the event has no record (only an end-of-event record arrived).
    pub fn is_empty(&self) -> bool {
        self.recs.is_empty()
    }

    /// Whether records of the event are known to be missing: a syscall event (a `SYSCALL`
    /// record, or an end-of-event record) lacks its `SYSCALL` record or its end-of-event
    /// record. The kernel dropped the rest (its `lost` counter has them).
    pub fn incomplete(&self) -> bool {
        let syscall = self.recs.iter().any(|r| r.0 == AUDIT_SYSCALL);
        match self.end {
            EventEnd::Eoe => !syscall,
            EventEnd::Wait => syscall,
            EventEnd::Single => false,
        }
    }

    /// Writes the event as auditd's log (`log_format = RAW`): one line per record,
    /// `type=NAME msg=audit(...): fields` (`type=UNKNOWN[n]` for a type without a name).
    pub fn write_auditd(&self, out: &mut Vec<u8>) {
        for r in self.records() {
            out.extend_from_slice(b"type=");
            match type_name(r.ty) {
                Some(n) => out.extend_from_slice(n.as_bytes()),
                None => out.extend_from_slice(format!("UNKNOWN[{}]", r.ty).as_bytes()),
            }
            out.extend_from_slice(b" msg=");
            // One line per record: a newline inside one (only a user-space message can carry
            // one; the kernel hex-encodes its own untrusted strings) is written as a space.
            let start = out.len();
            out.extend_from_slice(r.text);
            for c in &mut out[start..] {
                if *c == b'\n' {
                    *c = b' ';
                }
            }
            out.push(b'\n');
        }
    }
}

#[derive(Debug)]
struct Pending {
    ev: AuditEvent,
    last: Instant,
}

/// Counters of the grouper.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct GroupStats {
    /// Records taken.
    pub records: u64,
    /// Events handed out.
    pub events: u64,
    /// Of which closed by an end-of-event record.
    pub eoe: u64,
    /// Closed as single-record events.
    pub single: u64,
    /// Closed after the wait (or at close) without an end-of-event record.
    pub waited: u64,
    /// Events with records known to be missing ([`AuditEvent::incomplete`]).
    pub incomplete: u64,
    /// Events closed early because more than the most open events were waiting.
    pub evicted: u64,
}

/// Groups records into events by serial. Sans-IO: time comes in as an argument.
#[derive(Debug)]
pub(crate) struct Grouper {
    open: HashMap<u64, Pending>,
    /// Serials in the order their first record arrived (an event closed meanwhile is skipped).
    order: VecDeque<u64>,
    wait: Duration,
    max_open: usize,
    pub(crate) stats: GroupStats,
}

impl Grouper {
    pub(crate) fn new(wait: Duration, max_open: usize) -> Self {
        Self {
            open: HashMap::new(),
            order: VecDeque::new(),
            wait,
            max_open: max_open.max(1),
            stats: GroupStats::default(),
        }
    }

    fn close(&mut self, mut ev: AuditEvent, end: EventEnd, out: &mut Vec<AuditEvent>) {
        ev.end = end;
        self.stats.events += 1;
        match end {
            EventEnd::Eoe => self.stats.eoe += 1,
            EventEnd::Single => self.stats.single += 1,
            EventEnd::Wait => self.stats.waited += 1,
        }
        if ev.incomplete() {
            self.stats.incomplete += 1;
        }
        out.push(ev);
    }

    /// Takes one record; events it completes go to `out`.
    pub(crate) fn push(&mut self, r: &AuditRecord<'_>, now: Instant, out: &mut Vec<AuditEvent>) {
        self.stats.records += 1;
        if r.ty == AUDIT_EOE {
            let ev = match self.open.remove(&r.serial) {
                Some(p) => p.ev,
                None => AuditEvent {
                    serial: r.serial,
                    sec: r.sec,
                    msec: r.msec,
                    end: EventEnd::Eoe,
                    buf: Vec::new(),
                    recs: Vec::new(),
                },
            };
            self.close(ev, EventEnd::Eoe, out);
            return;
        }
        if standalone(r.ty) && !self.open.contains_key(&r.serial) {
            let mut ev = AuditEvent {
                serial: r.serial,
                sec: r.sec,
                msec: r.msec,
                end: EventEnd::Single,
                buf: Vec::with_capacity(r.text.len()),
                recs: Vec::with_capacity(1),
            };
            ev.buf.extend_from_slice(r.text);
            ev.recs.push((r.ty, 0, r.text.len() as u32));
            self.close(ev, EventEnd::Single, out);
            return;
        }
        let p = match self.open.entry(r.serial) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                self.order.push_back(r.serial);
                v.insert(Pending {
                    ev: AuditEvent {
                        serial: r.serial,
                        sec: r.sec,
                        msec: r.msec,
                        end: EventEnd::Wait,
                        buf: Vec::with_capacity(1024),
                        recs: Vec::with_capacity(6),
                    },
                    last: now,
                })
            }
        };
        let a = p.ev.buf.len() as u32;
        p.ev.buf.extend_from_slice(r.text);
        p.ev.recs.push((r.ty, a, p.ev.buf.len() as u32));
        p.last = now;
        while self.open.len() > self.max_open {
            let Some(s) = self.order.pop_front() else {
                break;
            };
            if let Some(p) = self.open.remove(&s) {
                self.stats.evicted += 1;
                self.close(p.ev, EventEnd::Wait, out);
            }
        }
    }

    /// Closes the events whose last record is older than the wait (all of them with `all`).
    pub(crate) fn expire(&mut self, now: Instant, all: bool, out: &mut Vec<AuditEvent>) {
        let mut i = 0;
        while i < self.order.len() {
            let s = self.order[i];
            let Some(p) = self.open.get(&s) else {
                self.order.remove(i);
                continue;
            };
            if all || now.saturating_duration_since(p.last) >= self.wait {
                let p = self.open.remove(&s).expect("present");
                self.order.remove(i);
                self.close(p.ev, EventEnd::Wait, out);
            } else {
                i += 1;
            }
        }
    }

    /// How long until the oldest open event's wait ends (`None`: none open).
    pub(crate) fn next_deadline(&self, now: Instant) -> Option<Duration> {
        self.open
            .values()
            .map(|p| (p.last + self.wait).saturating_duration_since(now))
            .min()
    }

    /// Events open now.
    pub(crate) fn open_events(&self) -> usize {
        self.open.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ty: u16, text: &'static str) -> AuditRecord<'static> {
        AuditRecord::parse_text(ty, text.as_bytes()).unwrap()
    }

    #[test]
    fn header_and_fields_parse_in_place_and_hex_decodes() {
        let r = rec(
            1327,
            "audit(1700000000.042:77): proctitle=636174002F746D702F6120622E747874\n\0",
        );
        assert_eq!((r.sec, r.msec, r.serial), (1700000000, 42, 77));
        assert_eq!(r.field("proctitle").unwrap().as_ref(), b"cat\0/tmp/a b.txt");
        let r = rec(
            1302,
            "audit(1.001:2): item=0 name=\"/tmp/x\" inode=5 nametype=NORMAL",
        );
        let f: Vec<_> = r
            .fields()
            .map(|f| (f.key, f.value().into_owned()))
            .collect();
        assert_eq!(f[1], (&b"name"[..], b"/tmp/x".to_vec()));
        assert_eq!(f[3], (&b"nametype"[..], b"NORMAL".to_vec()));
        // A bare hex-looking value of a trusted key stays as written.
        let r = rec(1300, "audit(1.001:2): arch=c000003e a0=ffffff9c");
        assert_eq!(r.field("arch").unwrap().as_ref(), b"c000003e");
        assert_eq!(r.field("a0").unwrap().as_ref(), b"ffffff9c");
        // EXECVE arguments are untrusted strings.
        let r = rec(1309, "audit(1.001:2): argc=2 a0=\"ls\" a1=2F746D702F612062");
        assert_eq!(r.field("a1").unwrap().as_ref(), b"/tmp/a b");
        // User messages: msg='...' with spaces and '=' inside is one field.
        let r = rec(
            1112,
            "audit(1.001:3): pid=1 uid=0 msg='op=login acct=\"x\" res=success'",
        );
        let f: Vec<_> = r.fields().collect();
        assert_eq!(f.len(), 3);
        assert_eq!(f[2].value().as_ref(), b"op=login acct=\"x\" res=success");
        assert!(AuditRecord::parse_text(1300, b"no header").is_err());
        let probe = NlMsg {
            ty: AUDIT_REPLACE,
            flags: 0,
            seq: 0,
            pid: 0,
            payload: &[0x5f, 0x2a, 0, 0],
        };
        assert_eq!(AuditRecord::parse(&probe), Ok(None));
        assert!(AuditRecord::parse_text(1300, b"audit(1.2:x): a=b").is_err());
    }

    #[test]
    fn events_close_on_eoe_alone_or_after_the_wait_and_say_what_is_missing() {
        let t0 = Instant::now();
        let mut g = Grouper::new(Duration::from_millis(100), 16);
        let mut out = Vec::new();
        g.push(&rec(1300, "audit(1.000:10): syscall=257"), t0, &mut out);
        g.push(&rec(1300, "audit(1.000:11): syscall=257"), t0, &mut out);
        g.push(&rec(1307, "audit(1.000:10): cwd=\"/\""), t0, &mut out);
        g.push(&rec(1112, "audit(1.000:12): msg='x'"), t0, &mut out);
        assert_eq!(out.len(), 1, "the user message is an event of its own");
        assert_eq!(out[0].end, EventEnd::Single);
        g.push(&rec(1320, "audit(1.000:10): "), t0, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(
            (out[1].serial, out[1].len(), out[1].end),
            (10, 2, EventEnd::Eoe)
        );
        assert!(!out[1].incomplete());
        let types: Vec<u16> = out[1].records().map(|r| r.ty).collect();
        assert_eq!(types, [1300, 1307]);
        // Serial 11 lost its EOE: closed after the wait, incomplete.
        g.expire(t0 + Duration::from_millis(50), false, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(g.next_deadline(t0), Some(Duration::from_millis(100)));
        g.expire(t0 + Duration::from_millis(100), false, &mut out);
        assert_eq!(out.len(), 3);
        assert!(out[2].incomplete());
        // An EOE whose SYSCALL record was lost.
        g.push(&rec(1302, "audit(1.000:13): item=0"), t0, &mut out);
        g.push(&rec(1320, "audit(1.000:13): "), t0, &mut out);
        assert!(out[3].incomplete());
        assert_eq!(
            (
                g.stats.events,
                g.stats.eoe,
                g.stats.single,
                g.stats.waited,
                g.stats.incomplete
            ),
            (4, 2, 1, 1, 2)
        );
        let mut log = Vec::new();
        out[1].write_auditd(&mut log);
        assert_eq!(
            log,
            b"type=SYSCALL msg=audit(1.000:10): syscall=257\ntype=CWD msg=audit(1.000:10): cwd=\"/\"\n"
        );
    }

    #[test]
    fn too_many_open_events_close_the_oldest_first() {
        let t0 = Instant::now();
        let mut g = Grouper::new(Duration::from_secs(10), 2);
        let mut out = Vec::new();
        g.push(&rec(1300, "audit(1.000:1): a=1"), t0, &mut out);
        g.push(&rec(1300, "audit(1.000:2): a=1"), t0, &mut out);
        g.push(&rec(1300, "audit(1.000:3): a=1"), t0, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].serial, 1);
        assert_eq!(g.stats.evicted, 1);
        g.expire(t0, true, &mut out);
        assert_eq!(out.len(), 3);
        assert_eq!(g.open_events(), 0);
    }
}
