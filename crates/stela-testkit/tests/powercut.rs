//! The power-cut layer through a real FUSE mount (needs /dev/fuse and root; fails, saying so,
//! without them): what is fsynced survives a cut, what is not is gone, for data and for names,
//! with both namespace rules; a directory too long for one readdir is listed whole; a Unix
//! socket can be bound on it (the daemon's is in its directory).

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use stela_testkit::powercut::{Namespace, PowerCutLayer};

fn mounted(namespace: Namespace) -> (tempfile::TempDir, PowerCutLayer) {
    let tmp = tempfile::tempdir().unwrap();
    let layer = PowerCutLayer::mount(tmp.path(), namespace);
    (tmp, layer)
}

fn sync_dir(dir: &Path) {
    File::open(dir).unwrap().sync_all().unwrap();
}

#[test]
fn a_write_not_synced_is_gone_after_a_cut_and_a_synced_one_stays() {
    let (_tmp, mut layer) = mounted(Namespace::Strict);
    let path = layer.path().join("f");
    let mut file = File::create(&path).unwrap();
    file.write_all(b"synced ").unwrap();
    file.sync_data().unwrap();
    sync_dir(layer.path());
    file.write_all(b"lost").unwrap();
    file.write_all_at(b"S", 0).unwrap();
    assert_eq!(
        fs::read(&path).unwrap(),
        b"Synced lost",
        "the programs see every write"
    );
    drop(file);
    let report = layer.cut();
    assert_eq!(report.unsynced_bytes, 5);
    assert_eq!(fs::read(&path).unwrap(), b"synced ");
}

#[test]
fn a_truncation_not_synced_is_undone_by_a_cut() {
    let (_tmp, mut layer) = mounted(Namespace::Strict);
    let path = layer.path().join("f");
    fs::write(&path, b"0123456789").unwrap();
    File::open(&path).unwrap().sync_all().unwrap();
    sync_dir(layer.path());
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(3)
        .unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"012");
    layer.cut();
    assert_eq!(fs::read(&path).unwrap(), b"0123456789");
}

#[test]
fn an_o_dsync_write_is_durable_when_it_returns() {
    let (_tmp, mut layer) = mounted(Namespace::Strict);
    let path = layer.path().join("f");
    File::create(&path).unwrap().sync_all().unwrap();
    sync_dir(layer.path());
    let file = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DSYNC)
        .open(&path)
        .unwrap();
    file.write_all_at(b"each write synced", 0).unwrap();
    drop(file);
    layer.cut();
    assert_eq!(fs::read(&path).unwrap(), b"each write synced");
}

#[test]
fn names_survive_only_their_directorys_fsync_with_the_strict_rule() {
    let (_tmp, mut layer) = mounted(Namespace::Strict);
    let root = layer.path().to_owned();
    fs::create_dir(root.join("d")).unwrap();
    sync_dir(&root);
    // Created and synced before its directory's fsync: kept, name and data.
    let mut f = File::create(root.join("d/new")).unwrap();
    f.write_all(b"data").unwrap();
    f.sync_all().unwrap();
    // Synced with its name, then renamed and removed without a directory sync.
    fs::write(root.join("d/old"), b"old").unwrap();
    File::open(root.join("d/old")).unwrap().sync_all().unwrap();
    fs::write(root.join("d/gone"), b"gone").unwrap();
    File::open(root.join("d/gone")).unwrap().sync_all().unwrap();
    sync_dir(&root.join("d"));
    fs::rename(root.join("d/old"), root.join("d/renamed")).unwrap();
    fs::remove_file(root.join("d/gone")).unwrap();
    // Synced itself after its directory's fsync: the data is durable, the name is not.
    let mut unnamed = File::create(root.join("d/unnamed")).unwrap();
    unnamed.write_all(b"data").unwrap();
    unnamed.sync_all().unwrap();
    fs::write(root.join("top"), b"top").unwrap();
    drop((f, unnamed));
    layer.cut();
    let mut names: Vec<String> = fs::read_dir(root.join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["gone", "new", "old"]);
    assert_eq!(fs::read(root.join("d/new")).unwrap(), b"data");
    assert_eq!(fs::read(root.join("d/old")).unwrap(), b"old");
    assert!(!root.join("top").exists());
    // And the other way: a rename followed by the directory's fsync stays.
    fs::rename(root.join("d/old"), root.join("d/renamed")).unwrap();
    sync_dir(&root.join("d"));
    layer.cut();
    assert_eq!(fs::read(root.join("d/renamed")).unwrap(), b"old");
    assert!(!root.join("d/old").exists());
}

#[test]
fn a_journaled_namespace_keeps_names_made_before_any_fsync_but_not_unsynced_data() {
    let (_tmp, mut layer) = mounted(Namespace::Journaled);
    let root = layer.path().to_owned();
    fs::create_dir(root.join("d")).unwrap();
    fs::write(root.join("d/a"), b"never synced").unwrap();
    fs::rename(root.join("d/a"), root.join("d/b")).unwrap();
    fs::write(root.join("synced"), b"synced").unwrap();
    File::open(root.join("synced"))
        .unwrap()
        .sync_data()
        .unwrap();
    fs::write(root.join("after"), b"after").unwrap();
    layer.cut();
    assert_eq!(
        fs::read(root.join("d/b")).unwrap(),
        b"",
        "the name, without its data"
    );
    assert_eq!(fs::read(root.join("synced")).unwrap(), b"synced");
    assert!(!root.join("d/a").exists());
    assert!(!root.join("after").exists(), "made after the last fsync");
}

#[test]
fn ownership_modes_and_unix_sockets_work_on_the_layer() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let (_tmp, layer) = mounted(Namespace::Strict);
    let dir = layer.path().join("owned");
    fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(1234), Some(5678)).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    let meta = fs::metadata(&dir).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o7777),
        (1234, 5678, 0o700)
    );
    let socket = layer.path().join("s.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let mut client = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    client.write_all(b"hello").unwrap();
    let (mut served, _) = listener.accept().unwrap();
    let mut got = [0u8; 5];
    std::io::Read::read_exact(&mut served, &mut got).unwrap();
    assert_eq!(&got, b"hello");
}

#[test]
fn a_directory_longer_than_one_readdir_reply_is_listed_whole_each_name_once() {
    let (_tmp, layer) = mounted(Namespace::Strict);
    let dir = layer.path().join("many");
    fs::create_dir(&dir).unwrap();
    // 1,000 names of 40 bytes: about 64 KiB of directory entries, many times what the kernel
    // asks for in one readdir, so the listing goes on from the offsets the layer handed out.
    let made: BTreeSet<String> = (0..1000).map(|i| format!("{i:040}")).collect();
    for name in &made {
        File::create(dir.join(name)).unwrap();
    }
    // (Bounded: a listing that repeats itself would otherwise never end.)
    let listed: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .take(made.len() + 10)
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(listed.len(), made.len(), "every name listed once");
    assert_eq!(listed.into_iter().collect::<BTreeSet<_>>(), made);
}
