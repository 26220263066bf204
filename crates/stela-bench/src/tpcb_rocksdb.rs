//! RocksDB as a TPC-B peer of `stela-bench tpcb` (`--systems rocksdb`, the `rocksdb` feature).
//!
//! The same database and transactions as on stela-store: the same keys and 100-byte rows, one
//! client per branch, a transaction that reads and rewrites an account, a teller and the branch
//! and adds a history row. RocksDB runs as a `TransactionDB` (pessimistic row locks, as a
//! client of a transactional store would use it); each read that is rewritten is a
//! `get_for_update`. Commit durability: `sync = true` on the commit's write options for `disk`
//! (RocksDB fsyncs its WAL, grouping concurrent commits), `sync = false` for `buffered` (the
//! WAL write reaches the OS, as stela's buffered embedded log does). Its memtable flushes and
//! compactions run on its own background threads, with their defaults.
//!
//! The database is loaded afresh for each run, in write batches (this crate release offers no
//! explicit flush on a `TransactionDB`: RocksDB moves the rows from its memtable to sorted
//! files when it fills, as it would in service); after the run the TPC-B invariant is checked
//! by scanning each table's key range.

#[cfg(not(feature = "rocksdb"))]
pub fn run(
    _base: &std::path::Path,
    _args: &crate::tpcb_schema::TpcbArgs,
    _repeat: usize,
) -> anyhow::Result<crate::tpcb_schema::TpcbRun> {
    anyhow::bail!(
        "this stela-bench was built without RocksDB: build it with `--features rocksdb` \
         (needs Debian's librocksdb-dev and libclang-dev)"
    )
}

#[cfg(feature = "rocksdb")]
pub use with_rocksdb::run;

#[cfg(feature = "rocksdb")]
mod with_rocksdb {
    use crate::tpcb_schema::{
        account_key, balance, branch_key, delta_and_account, drive_clients, history_key, row,
        teller_key, DurabilityArg, TpcbArgs, TpcbRun, TELLERS_PER_BRANCH,
    };
    use anyhow::{bail, Context};
    use rocksdb::{
        BlockBasedOptions, Cache, Direction, ErrorKind, IteratorMode, Options, TransactionDB,
        TransactionDBOptions, TransactionOptions, WriteBatchWithTransaction, WriteOptions,
    };
    use std::path::Path;

    /// Rows per load batch.
    const LOAD_BATCH: u32 = 10_000;

    pub fn run(base: &Path, args: &TpcbArgs, repeat: usize) -> anyhow::Result<TpcbRun> {
        let path = base.join(format!("rocksdb-{repeat}"));
        let mut options = Options::default();
        options.create_if_missing(true);
        // The background work (flushes, compactions) may use both CPUs, as the defaults of a
        // production setup would; stela-store's services run on threads of their own too.
        options.increase_parallelism(2);
        // A block cache as large as stela-store's buffer pool (the default is 32 MiB), so that
        // reads are served from RocksDB's memory as the store's are from its pool.
        let mut table_options = BlockBasedOptions::default();
        let cache = Cache::new_lru_cache(crate::tpcb_schema::pool_mb(args) << 20)
            .context("creating RocksDB's block cache")?;
        table_options.set_block_cache(&cache);
        options.set_block_based_table_factory(&table_options);
        let db: TransactionDB =
            TransactionDB::open(&options, &TransactionDBOptions::default(), &path)
                .with_context(|| format!("opening RocksDB at {}", path.display()))?;
        load(&db, args)?;
        let mut write_options = WriteOptions::default();
        write_options.set_sync(args.durability == DurabilityArg::Disk);
        let transaction_options = TransactionOptions::default();
        let driven = drive_clients(
            args,
            |_| Ok(0u64),
            |seq, b, rng| loop {
                let (delta, account_branch, a) = delta_and_account(args, b, rng);
                let account = account_key(account_branch, a);
                let teller = teller_key(b, rng.below(TELLERS_PER_BRANCH));
                // History keys: the client's branch and its own sequence, unique per run.
                *seq += 1;
                match transaction(
                    &db,
                    &write_options,
                    &transaction_options,
                    &account,
                    &teller,
                    b,
                    *seq,
                    delta,
                ) {
                    // A lock wait that timed out or a deadlock (remote accounts only): the
                    // transaction was rolled back; run a new one.
                    Err(error) if matches!(error.kind(), ErrorKind::Busy | ErrorKind::TimedOut) => {
                        continue
                    }
                    result => {
                        result?;
                        return Ok(delta);
                    }
                }
            },
        )?;
        for prefix in [b"a", b"t", b"b", b"h"] {
            let sum = sum_balances(&db, prefix)?;
            if sum != driven.deltas {
                bail!(
                    "RocksDB: TPC-B invariant broken: rows under {:?} sum to {sum}, the clients \
                     applied {}",
                    String::from_utf8_lossy(prefix),
                    driven.deltas
                );
            }
        }
        drop(db);
        let _ = std::fs::remove_dir_all(&path);
        Ok(driven.into_run("rocksdb", "rocksdb-flush", "none", 0, args, repeat))
    }

    /// One TPC-B transaction: `delta` added to the account, the teller and branch `b`, and
    /// its history row `seq` added; dropped (rolled back) on any error.
    #[allow(clippy::too_many_arguments)]
    fn transaction(
        db: &TransactionDB,
        write_options: &WriteOptions,
        transaction_options: &TransactionOptions,
        account: &[u8],
        teller: &[u8],
        b: u32,
        seq: u64,
        delta: i64,
    ) -> Result<(), rocksdb::Error> {
        let txn = db.transaction_opt(write_options, transaction_options);
        for key in [account, teller, &branch_key(b)] {
            // Every row was loaded; a missing one would read as 0 and break the invariant,
            // which the run checks at its end.
            let old = txn
                .get_for_update(key, true)?
                .map_or(0, |r| balance(&r).unwrap_or(0));
            txn.put(key, row(old + delta))?;
        }
        txn.put(history_key(b, seq), row(delta))?;
        txn.commit()
    }

    fn load(db: &TransactionDB, args: &TpcbArgs) -> anyhow::Result<()> {
        let zero = row(0);
        for b in 0..args.clients {
            let mut batch = WriteBatchWithTransaction::<true>::default();
            batch.put(branch_key(b), &zero);
            for t in 0..TELLERS_PER_BRANCH {
                batch.put(teller_key(b, t), &zero);
            }
            db.write(batch)?;
            let mut a = 0;
            while a < args.accounts {
                let mut batch = WriteBatchWithTransaction::<true>::default();
                for a in a..(a + LOAD_BATCH).min(args.accounts) {
                    batch.put(account_key(b, a), &zero);
                }
                db.write(batch)?;
                a += LOAD_BATCH;
            }
        }
        Ok(())
    }

    /// The sum of the balances of every row whose key starts with `prefix` (one table).
    fn sum_balances(db: &TransactionDB, prefix: &[u8]) -> anyhow::Result<i64> {
        let mut sum = 0i64;
        for item in db.iterator(IteratorMode::From(prefix, Direction::Forward)) {
            let (key, value) = item?;
            if !key.starts_with(prefix) {
                break;
            }
            sum += balance(&value)?;
        }
        Ok(sum)
    }
}
