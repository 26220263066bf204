//! `stela wal verify|dump|repair` on bad input: what is not a log is said to be so (exit 4),
//! never `clean`; and on a damaged log the three tools agree.
//!
//! The sweep flips one bit of every byte of a small log (three segments) and checks, for each:
//! - `verify` clean ⇔ `dump` reports no damage;
//! - a damaged log's `dump` prints exactly the valid prefix: records 1.. of what was written,
//!   up to verify's first damage, and nothing after it;
//! - `repair --corrupt-suffix` then succeeds, the repaired log verifies clean, and it holds
//!   exactly the records `dump` printed (so the three tools agree on where the log ends);
//! - a clean verdict means the log reads back as a prefix of what was written (a flip in the
//!   newest segment's last record is a torn tail, which recovery may cut).
//!
//! It runs the tools in-process (`stela_wal::tools`, what the commands call) to stay fast, and a
//! few damage classes through the real `stela` binary for the exit codes and messages.

mod common;

use common::{stela, text};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use stela_wal::storage::StdStorage;
use stela_wal::{tools, Codec, Lsn, Wal, WalOptions};

const RECORDS: usize = 48;

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("stela-tools")
        .tempdir()
        .unwrap()
}

fn record(i: usize) -> String {
    format!("record {i:03} {}", "x".repeat(i % 7 * 8))
}

fn options() -> WalOptions {
    WalOptions::default()
        .codec(Codec::MessagePack)
        .segment_bytes(1024)
        .type_tag("tools_bad_input::Record")
}

/// A log of RECORDS committed records over several small segments.
fn write_log(dir: &Path) {
    let wal: Wal<String> = Wal::open(dir, options()).unwrap();
    for i in 1..=RECORDS {
        let lsn = wal.append(&record(i)).unwrap();
        wal.commit(lsn).unwrap();
    }
    wal.close().unwrap();
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    files.sort();
    files
}

fn copy_log(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for file in segments(from) {
        std::fs::copy(&file, to.join(file.file_name().unwrap())).unwrap();
    }
}

/// The records `dump` prints, and its damage.
fn dump(dir: &Path) -> (Vec<String>, Vec<String>) {
    let mut out = Vec::new();
    let report = tools::dump(dir, Arc::new(StdStorage), Lsn::FIRST, &mut out).unwrap();
    let records: Vec<String> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            value["record"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(records.len() as u64, report.records);
    (records, report.problems)
}

fn written() -> Vec<String> {
    (1..=RECORDS).map(record).collect()
}

/// Checks the three tools' agreement on the log in `dir`; `what` names the damage.
fn check_agreement(dir: &Path, what: &str) {
    let verdict = tools::verify(dir, &StdStorage).unwrap();
    let (dumped, problems) = dump(dir);
    assert_eq!(
        !verdict.is_damaged(),
        problems.is_empty(),
        "{what}: verify and dump disagree: {:?} / {problems:?}",
        verdict.problems
    );
    assert!(
        written().starts_with(&dumped),
        "{what}: dump printed records that were not written in that order: {dumped:?}"
    );
    if !verdict.is_damaged() {
        return;
    }
    let end = verdict.valid_prefix_end.expect("damage has a place");
    assert_eq!(
        dumped.len() as u64 + 1,
        end.get(),
        "{what}: dump stopped elsewhere than verify's first damage ({:?})",
        verdict.problems
    );
    let repaired = tools::repair(dir, Arc::new(StdStorage), true);
    let repaired = repaired.unwrap_or_else(|e| panic!("{what}: repair --corrupt-suffix: {e}"));
    assert!(
        repaired.salvage_dir.is_some(),
        "{what}: repair removed damage without keeping a copy"
    );
    let after = tools::verify(dir, &StdStorage);
    match after {
        Ok(after) => assert!(
            after.is_clean(),
            "{what}: still damaged after repair: {:?}",
            after.problems
        ),
        // Damage at LSN 1 leaves nothing of the log: every segment went to the salvage folder.
        Err(stela_wal::Error::NotALog { .. }) => {
            assert!(dumped.is_empty(), "{what}: repair dropped the valid prefix");
            return;
        }
        Err(error) => panic!("{what}: verify after repair: {error}"),
    }
    let (again, problems) = dump(dir);
    assert!(problems.is_empty(), "{what}: {problems:?}");
    assert_eq!(
        again, dumped,
        "{what}: the repaired log does not hold exactly the valid prefix"
    );
}

#[test]
fn every_flipped_byte_gets_the_same_verdict_from_every_tool() {
    let base = tempdir();
    let original = base.path().join("original");
    write_log(&original);
    let files = segments(&original);
    assert!(
        files.len() >= 3,
        "the sweep wants several segments: {files:?}"
    );
    let mut damaged = 0;
    let mut cases = 0;
    for (index, file) in files.iter().enumerate() {
        let bytes = std::fs::read(file).unwrap();
        for offset in 0..bytes.len() {
            let case = base.path().join(format!("c{index}-{offset}"));
            copy_log(&original, &case);
            let target = case.join(file.file_name().unwrap());
            let mut flipped = bytes.clone();
            flipped[offset] ^= 0x10;
            std::fs::write(&target, &flipped).unwrap();
            let what = format!(
                "{} byte {offset}",
                file.file_name().unwrap().to_string_lossy()
            );
            // Before the check, which repairs the copy.
            let seen = !tools::verify(&case, &StdStorage).is_ok_and(|r| r.is_clean());
            check_agreement(&case, &what);
            if std::env::var_os("STELA_SWEEP_TRACE").is_some() {
                eprintln!("{what}: {}", if seen { "damage" } else { "clean" });
            }
            damaged += usize::from(seen);
            cases += 1;
            std::fs::remove_dir_all(&case).unwrap();
        }
    }
    // A sweep that finds no damage checks nothing: most flips must be seen.
    assert!(
        damaged * 2 > cases,
        "{damaged} of {cases} flips were damage"
    );
}

#[test]
fn lost_and_cut_segments_get_the_same_verdict_from_every_tool() {
    let base = tempdir();
    let original = base.path().join("original");
    write_log(&original);
    let files = segments(&original);
    let name = |i: usize| files[i].file_name().unwrap().to_owned();

    // A segment in the middle is lost.
    let lost = base.path().join("lost");
    copy_log(&original, &lost);
    std::fs::remove_file(lost.join(name(1))).unwrap();
    check_agreement(&lost, "a lost middle segment");

    // A sealed segment is cut at each length, frame boundaries included; the newest is cut
    // inside its header.
    let first_len = std::fs::metadata(&files[0]).unwrap().len();
    // Every frame boundary of the first segment (a sealed segment cut exactly between two
    // records), and lengths inside the header and inside frames.
    let bytes = std::fs::read(&files[0]).unwrap();
    let mut boundaries = vec![256u64];
    let mut at = 256usize;
    while at + 4 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        if len == 0 {
            break;
        }
        at += 20 + len;
        boundaries.push(at as u64);
    }
    assert!(boundaries.len() > 3, "{boundaries:?}");
    let mut cuts = vec![0, 100, 300, 500, first_len - 1];
    cuts.extend(&boundaries);
    for keep in cuts {
        let cut = base.path().join(format!("cut{keep}"));
        copy_log(&original, &cut);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(cut.join(name(0)))
            .unwrap();
        file.set_len(keep).unwrap();
        check_agreement(&cut, &format!("the first segment cut to {keep} bytes"));
    }
    let newest = files.len() - 1;
    let cut = base.path().join("cut-newest-header");
    copy_log(&original, &cut);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(cut.join(name(newest)))
        .unwrap();
    file.set_len(100).unwrap();
    check_agreement(&cut, "the newest segment's header cut");
}

#[test]
fn what_is_not_a_log_is_said_to_be_so() {
    let base = tempdir();
    let file = base.path().join("a-file");
    std::fs::write(&file, b"not a log").unwrap();
    let empty = base.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let app = base.path().join("app");
    std::fs::create_dir(&app).unwrap();
    std::fs::write(app.join("settings.toml"), b"x = 1").unwrap();
    let missing = base.path().join("missing");
    for (path, reason) in [
        (&missing, "no such file or directory"),
        (&file, "a file, not a log directory"),
        (&empty, "without segment files"),
        (&app, "without segment files"),
    ] {
        for tool in [
            vec!["wal", "verify"],
            vec!["wal", "dump"],
            vec!["wal", "repair"],
            vec!["wal", "repair", "--corrupt-suffix"],
        ] {
            let mut args = tool.clone();
            args.push(path.to_str().unwrap());
            let out = stela(&args);
            let shown = text(&out);
            assert_eq!(out.status.code(), Some(4), "{args:?}: {shown}");
            assert!(
                shown.contains("not a log") && shown.contains(reason),
                "{args:?}: {shown}"
            );
            assert!(!shown.contains("clean"), "{args:?}: {shown}");
            assert_eq!(
                shown.matches("os error").count(),
                0,
                "{args:?}: an OS error code instead of the reason: {shown}"
            );
        }
    }
    // Nothing was created or changed.
    assert!(!missing.exists());
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(&app).unwrap().count(), 1);
}

#[test]
fn dump_of_a_damaged_log_prints_the_valid_prefix_and_exits_like_verify() {
    let base = tempdir();
    let dir = base.path().join("log");
    write_log(&dir);
    let files = segments(&dir);
    // A flipped byte in the header of the oldest segment (the magic): nothing is valid.
    let mut bytes = std::fs::read(&files[0]).unwrap();
    bytes[0] ^= 0xff;
    std::fs::write(&files[0], &bytes).unwrap();
    let dir_arg = dir.to_str().unwrap();
    let verify = stela(&["wal", "verify", dir_arg]);
    assert_eq!(verify.status.code(), Some(1), "{}", text(&verify));
    let dump = stela(&["wal", "dump", dir_arg]);
    assert_eq!(dump.status.code(), Some(1), "{}", text(&dump));
    assert!(dump.stdout.is_empty(), "{}", text(&dump));
    assert!(
        String::from_utf8_lossy(&dump.stderr).contains("bad segment header"),
        "{}",
        text(&dump)
    );

    // A flipped byte in a record of the second segment: the first segment's records are
    // printed, then the damage is named on stderr.
    let dir = base.path().join("log2");
    write_log(&dir);
    let files = segments(&dir);
    let mut bytes = std::fs::read(&files[1]).unwrap();
    bytes[300] ^= 0x01;
    std::fs::write(&files[1], &bytes).unwrap();
    let dir_arg = dir.to_str().unwrap();
    let dump = stela(&["wal", "dump", dir_arg]);
    assert_eq!(dump.status.code(), Some(1), "{}", text(&dump));
    let printed = String::from_utf8_lossy(&dump.stdout).lines().count();
    assert!(printed > 0, "{}", text(&dump));
    let stderr = String::from_utf8_lossy(&dump.stderr);
    assert!(
        stderr.contains(&format!("damaged after the {printed} record(s)"))
            && stderr.contains("CORRUPT"),
        "{stderr}"
    );
    let repair = stela(&["wal", "repair", "--corrupt-suffix", dir_arg]);
    assert_eq!(repair.status.code(), Some(0), "{}", text(&repair));
    let verify = stela(&["wal", "verify", dir_arg]);
    assert_eq!(verify.status.code(), Some(0), "{}", text(&verify));
    let dump = stela(&["wal", "dump", dir_arg]);
    assert_eq!(dump.status.code(), Some(0), "{}", text(&dump));
    assert_eq!(
        String::from_utf8_lossy(&dump.stdout).lines().count(),
        printed
    );
}
