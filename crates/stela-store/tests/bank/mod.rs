//! The workload the follower's tests share: accounts whose balances sum to a constant, moved by
//! transfer transactions that each also write a marker of their own, so that a check sees every
//! acknowledged transaction (its marker), no uncommitted one (the sum, and no loser's key).

#![allow(dead_code)]

use std::ops::Bound;
use stela_store::{Result, Store};

const START: i64 = 1000;

/// A small, repeatable generator (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0.max(1);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub fn account(i: u32) -> Vec<u8> {
    format!("acct-{i:06}").into_bytes()
}

fn marker(n: u64) -> Vec<u8> {
    format!("done-{n:09}").into_bytes()
}

/// A balance, padded so that the accounts fill a few dozen pages.
fn balance(value: i64) -> Vec<u8> {
    let mut bytes = format!("{value}|").into_bytes();
    bytes.resize(120, b'.');
    bytes
}

fn parse(bytes: &[u8]) -> i64 {
    let text = std::str::from_utf8(bytes).expect("a balance is text");
    text.split('|').next().unwrap().parse().expect("a balance")
}

/// The accounts, and the transfers acknowledged so far.
pub struct Bank {
    pub accounts: u32,
    /// Transfers whose commit returned.
    pub acked: Vec<u64>,
    /// The transfer whose commit failed, if one did (it may or may not be in the log).
    pub in_doubt: Option<u64>,
    next: u64,
}

impl Bank {
    /// Creates `accounts` accounts at the starting balance.
    pub fn seed(store: &Store, accounts: u32) -> Bank {
        for chunk in (0..accounts).collect::<Vec<_>>().chunks(500) {
            let mut txn = store.begin();
            for &i in chunk {
                txn.put(&account(i), &balance(START)).unwrap();
            }
            txn.commit().unwrap();
        }
        Bank {
            accounts,
            acked: Vec::new(),
            in_doubt: None,
            next: 0,
        }
    }

    /// A bank whose accounts exist already (seeded elsewhere).
    pub fn existing(accounts: u32) -> Bank {
        Bank {
            accounts,
            acked: Vec::new(),
            in_doubt: None,
            next: 0,
        }
    }

    /// One transfer between two accounts, with its marker.
    pub fn transfer(&mut self, store: &Store, rng: &mut Rng) -> Result<()> {
        let n = self.next;
        self.next += 1;
        let from = rng.below(u64::from(self.accounts)) as u32;
        let to = (from + 1 + rng.below(u64::from(self.accounts) - 1) as u32) % self.accounts;
        let amount = rng.below(100) as i64 + 1;
        let mut txn = store.begin();
        let a = parse(&txn.get(&account(from))?.expect("the account exists"));
        let b = parse(&txn.get(&account(to))?.expect("the account exists"));
        txn.put(&account(from), &balance(a - amount))?;
        txn.put(&account(to), &balance(b + amount))?;
        txn.put(&marker(n), b"")?;
        match txn.commit() {
            Ok(()) => {
                self.acked.push(n);
                Ok(())
            }
            Err(e) => {
                self.in_doubt = Some(n);
                Err(e)
            }
        }
    }

    pub fn transfers(&mut self, store: &Store, rng: &mut Rng, n: usize) {
        for _ in 0..n {
            self.transfer(store, rng).expect("a transfer");
        }
    }

    /// A transaction that writes and never ends: running when the store dies, its writes in
    /// the durable log.
    pub fn leave_a_loser(&self, store: &Store) {
        let mut txn = store.begin();
        for i in 0..self.accounts.min(40) {
            txn.put(&account(i), &balance(0)).unwrap();
        }
        txn.put(b"loser", b"never committed").unwrap();
        std::mem::forget(txn);
        // A commit after it makes the log durable past the loser's writes.
        let mut txn = store.begin();
        txn.put(b"zz-after-the-loser", b"").unwrap();
        txn.commit().unwrap();
    }

    /// Every acknowledged transfer is there, nothing uncommitted is, the sum is kept.
    pub fn check(&self, store: &Store) {
        let mut txn = store.begin();
        let all: Vec<_> = txn
            .scan(Bound::Unbounded, Bound::Unbounded)
            .collect::<Result<_>>()
            .unwrap();
        txn.commit().unwrap();
        let mut sum = 0;
        let mut accounts = 0;
        let mut markers = std::collections::BTreeSet::new();
        for (key, value) in &all {
            assert_ne!(key.as_slice(), b"loser", "an uncommitted write is visible");
            if key.starts_with(b"acct-") {
                sum += parse(value);
                accounts += 1;
            } else if let Some(n) = key.strip_prefix(b"done-") {
                markers.insert(std::str::from_utf8(n).unwrap().parse::<u64>().unwrap());
            }
        }
        assert_eq!(accounts, self.accounts, "every account");
        assert_eq!(sum, i64::from(self.accounts) * START, "the balances' sum");
        for n in &self.acked {
            assert!(markers.contains(n), "acknowledged transfer {n} is missing");
        }
        for n in &markers {
            assert!(
                self.acked.contains(n) || self.in_doubt == Some(*n),
                "transfer {n} was never acknowledged"
            );
        }
    }
}
