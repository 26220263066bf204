//! stela-store logging through a real `stela serve` process at `disk`, the daemon SIGKILLed
//! while transactions commit, round after round.
//!
//! Four threads run transfers (two accounts and one history row per transaction, the transfer's
//! amount on the history row) on a store in this process, opened with `Store::open_on_daemon`.
//! At a random moment the daemon is SIGKILLed: the store's calls fail, the store is dropped
//! (its process state is gone as in a crash), the daemon is restarted on the same directory and
//! the store reopened, which runs restart over the daemon's log. Then:
//! - every history row whose commit returned is there (a `disk` commit survives the daemon);
//! - every account's balance is the starting balance moved by exactly the history rows present
//!   (each row names its two accounts and amount): no half of a transaction, committed or
//!   not, is visible;
//! - at most one history row per thread beyond the acknowledged ones (the commit in flight).
//!
//! Kill moments come from the seed the shared test generator prints (`common::records::Rng`),
//! so a failure can be replayed.

mod common;

use common::records::Rng;
use common::Daemon;
use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use stela_client::{Durability, WalOptions};
use stela_store::{Error, Store, StoreOptions};

const ACCOUNTS: u32 = 200;
const START_BALANCE: i64 = 1_000;
const THREADS: u32 = 4;
const ROUNDS: u32 = 4;

fn account(i: u32) -> Vec<u8> {
    format!("account-{i:05}").into_bytes()
}

fn history(thread: u32, round: u32, seq: u64) -> Vec<u8> {
    format!("history-{thread}-{round:03}-{seq:08}").into_bytes()
}

fn balance(bytes: &[u8]) -> i64 {
    std::str::from_utf8(bytes).unwrap().parse().unwrap()
}

fn open(store_dir: &std::path::Path, daemon: &Daemon) -> Store {
    Store::open_on_daemon(
        store_dir,
        daemon.socket(),
        "bank",
        WalOptions::default().durability(Durability::Disk),
        StoreOptions::on_request()
            .archive(false)
            .lock_timeout(None)
            .pool_pages(64),
    )
    .expect("the store opens on the daemon")
}

/// One transfer; `Ok(false)` when it was a deadlock victim (aborted, to be retried).
fn transfer(store: &Store, from: u32, to: u32, amount: i64, row: &[u8]) -> Result<bool, Error> {
    let mut txn = store.begin();
    let step = (|| -> Result<(), Error> {
        let a = balance(&txn.get(&account(from))?.expect("account exists"));
        let b = balance(&txn.get(&account(to))?.expect("account exists"));
        txn.put(&account(from), (a - amount).to_string().as_bytes())?;
        txn.put(&account(to), (b + amount).to_string().as_bytes())?;
        txn.put(row, format!("{from} {to} {amount}").as_bytes())?;
        Ok(())
    })();
    match step {
        Ok(()) => txn.commit().map(|()| true),
        Err(Error::Deadlock { .. }) => {
            txn.abort()?;
            Ok(false)
        }
        Err(other) => Err(other),
    }
}

#[test]
fn disk_commits_survive_the_daemon_sigkill() {
    let base = tempfile::tempdir().unwrap();
    let daemon_dir = base.path().join("daemon");
    let store_dir = base.path().join("store");
    std::fs::create_dir_all(&daemon_dir).unwrap();
    let mut rng = Rng::from_env("disk_commits_survive_the_daemon_sigkill");
    let mut daemon = Daemon::start(&daemon_dir, &[]);
    {
        let store = open(&store_dir, &daemon);
        let mut txn = store.begin();
        for i in 0..ACCOUNTS {
            txn.put(&account(i), START_BALANCE.to_string().as_bytes())
                .unwrap();
        }
        txn.commit().unwrap();
        store.close().unwrap();
    }
    let acknowledged = Arc::new(Mutex::new(BTreeSet::<Vec<u8>>::new()));
    for round in 0..ROUNDS {
        let store = Arc::new(open(&store_dir, &daemon));
        let failed = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..THREADS)
            .map(|thread| {
                let store = Arc::clone(&store);
                let acknowledged = Arc::clone(&acknowledged);
                let failed = Arc::clone(&failed);
                let mut rng = rng.split();
                std::thread::spawn(move || {
                    for seq in 0.. {
                        let from = rng.below(u64::from(ACCOUNTS)) as u32;
                        let to = (from + 1 + rng.below(u64::from(ACCOUNTS - 1)) as u32) % ACCOUNTS;
                        let amount = rng.below(50) as i64 + 1;
                        let row = history(thread, round, seq);
                        match transfer(&store, from, to, amount, &row) {
                            Ok(true) => {
                                acknowledged.lock().unwrap().insert(row);
                            }
                            Ok(false) => {}
                            Err(_) => {
                                failed.store(true, Ordering::Release);
                                return;
                            }
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(rng.millis(300, 1000));
        let acked_before_kill = acknowledged.lock().unwrap().len();
        daemon.kill();
        for worker in workers {
            worker.join().expect("a worker panicked");
        }
        assert!(
            failed.load(Ordering::Acquire),
            "round {round}: no transaction noticed the daemon's death"
        );
        assert!(
            acked_before_kill > 0,
            "round {round}: nothing committed before the kill"
        );
        // The store's process state dies with the daemon's connection: drop it as a crash.
        drop(Arc::try_unwrap(store).ok().expect("workers are gone"));
        daemon = Daemon::start(&daemon_dir, &[]);
        let store = open(&store_dir, &daemon);
        let mut txn = store.begin();
        let rows: Vec<_> = txn
            .scan(Bound::Unbounded, Bound::Unbounded)
            .collect::<Result<_, _>>()
            .unwrap();
        txn.commit().unwrap();
        // The balances the history rows present imply: a transaction half there (its
        // transfer without its row, or the reverse) breaks the equality below.
        let mut implied = vec![START_BALANCE; ACCOUNTS as usize];
        let (mut accounts, mut present) = (Vec::new(), BTreeSet::new());
        for (key, value) in &rows {
            if key.starts_with(b"account-") {
                accounts.push(balance(value));
            } else {
                let text = std::str::from_utf8(value).unwrap();
                let parts: Vec<i64> = text.split(' ').map(|p| p.parse().unwrap()).collect();
                implied[parts[0] as usize] -= parts[2];
                implied[parts[1] as usize] += parts[2];
                present.insert(key.clone());
            }
        }
        let mut acknowledged = acknowledged.lock().unwrap();
        let missing: Vec<_> = acknowledged.difference(&present).collect();
        assert!(
            missing.is_empty(),
            "round {round}: {} acknowledged commits lost, first {:?}",
            missing.len(),
            String::from_utf8_lossy(missing[0])
        );
        // At most one commit per thread was in flight at the kill. Those that survived are
        // durable from now on: later rounds must keep them, as they keep acknowledged ones
        // (counted with all rounds' rows, they would add up past the bound).
        let unacknowledged: Vec<Vec<u8>> = present.difference(&acknowledged).cloned().collect();
        assert!(
            unacknowledged.len() as u32 <= THREADS,
            "round {round}: {} history rows nobody was told about",
            unacknowledged.len()
        );
        acknowledged.extend(unacknowledged);
        assert_eq!(
            accounts, implied,
            "round {round}: the balances are not what the history rows say"
        );
        eprintln!(
            "round {round}: {} acknowledged, {} present, {} losers rolled back",
            acknowledged.len(),
            present.len(),
            store.restart_report().losers.len()
        );
        store.close().unwrap();
    }
    daemon.kill();
}
