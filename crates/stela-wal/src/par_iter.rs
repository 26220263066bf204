//! [`ParIter`]: reading a log back with the decoding spread over several threads.
//!
//! Replaying a log is CPU bound once the files are in the page cache, and most of the CPU goes
//! to the codec (a MessagePack record of ~100 bytes costs a few hundred nanoseconds to decode,
//! its frame check a few dozen). So one thread reads and checks frames in batches, and
//! `threads` workers decode whole batches; the caller still sees records one at a time, in LSN
//! order, exactly as [`crate::Iter`] yields them.
//!
//! Invariants:
//! - Batch `k` goes to worker `k % threads` and the consumer takes batch `k` from that worker's
//!   output, so order is kept without a reordering buffer.
//! - Every channel is bounded: at most `2 * threads + 2` batches (each at most
//!   [`BATCH_BYTES`] of payload) exist at once, however far ahead the reader could run.
//! - The first error (a damaged frame, an I/O error, a record that does not decode) is the last
//!   item: nothing after it is yielded, as with the sequential iterator.
//! - Dropping the iterator stops and joins every thread it started: a closed channel ends each
//!   loop, so no thread keeps reading the log's files afterwards.

use crate::error::{Error, Result};
use crate::reader::RawReader;
use serde::de::DeserializeOwned;
use std::ops::Range;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;
use stela_format::{Codec, Lsn};

/// Payload bytes per batch: large enough that channel hand-offs cost nothing per record, small
/// enough that the first records arrive quickly.
pub const BATCH_BYTES: usize = 256 << 10;

/// Frames read and checked, not yet decoded.
struct RawBatch {
    payloads: Vec<u8>,
    records: Vec<(Lsn, Range<usize>)>,
    /// The reader's error after the records, if it stopped at one.
    error: Option<Error>,
}

type Decoded<T> = Vec<Result<(Lsn, T)>>;

/// Records of a [`crate::Wal`] in LSN order, decoded by worker threads. See the module
/// documentation; made by [`crate::Wal::par_iter_from`].
pub struct ParIter<T> {
    outputs: Vec<Receiver<Decoded<T>>>,
    next_output: usize,
    current: std::vec::IntoIter<Result<(Lsn, T)>>,
    finished: bool,
    threads: Vec<JoinHandle<()>>,
}

impl<T: DeserializeOwned + Send + 'static> ParIter<T> {
    pub(crate) fn start(reader: RawReader, codec: Codec, threads: usize) -> Result<ParIter<T>> {
        let threads = threads.max(1);
        let mut inputs = Vec::with_capacity(threads);
        let mut outputs = Vec::with_capacity(threads);
        let mut handles = Vec::with_capacity(threads + 1);
        for i in 0..threads {
            let (input_tx, input_rx) = sync_channel::<RawBatch>(1);
            let (output_tx, output_rx) = sync_channel::<Decoded<T>>(1);
            inputs.push(input_tx);
            outputs.push(output_rx);
            handles.push(spawn(format!("stela-wal-decode-{i}"), move || {
                decode_batches(codec, input_rx, output_tx)
            })?);
        }
        handles.push(spawn("stela-wal-read".into(), move || {
            read_batches(reader, inputs)
        })?);
        Ok(ParIter {
            outputs,
            next_output: 0,
            current: Vec::new().into_iter(),
            finished: false,
            threads: handles,
        })
    }
}

fn spawn(name: String, body: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name)
        .spawn(body)
        .map_err(|e| Error::io("spawn reader thread", "", e))
}

/// The reading thread: cuts the log into batches and deals them out round robin.
fn read_batches(mut reader: RawReader, workers: Vec<SyncSender<RawBatch>>) {
    for worker in workers.iter().cycle() {
        let mut batch = RawBatch {
            payloads: Vec::with_capacity(BATCH_BYTES + (64 << 10)),
            records: Vec::new(),
            error: None,
        };
        let mut ended = false;
        while batch.payloads.len() < BATCH_BYTES {
            match reader.next_record() {
                Some(Ok((lsn, payload))) => {
                    let start = batch.payloads.len();
                    batch.payloads.extend_from_slice(payload);
                    batch.records.push((lsn, start..batch.payloads.len()));
                }
                Some(Err(error)) => {
                    batch.error = Some(error);
                    ended = true;
                    break;
                }
                None => {
                    ended = true;
                    break;
                }
            }
        }
        if worker.send(batch).is_err() || ended {
            return; // consumer gone, or nothing more to read
        }
    }
}

/// A decoding worker: turns each raw batch into records, stopping at the first failure.
fn decode_batches<T: DeserializeOwned>(
    codec: Codec,
    input: Receiver<RawBatch>,
    output: SyncSender<Decoded<T>>,
) {
    while let Ok(batch) = input.recv() {
        let mut decoded = Vec::with_capacity(batch.records.len() + 1);
        let mut failed = false;
        for (lsn, range) in batch.records {
            let item = codec
                .decode(&batch.payloads[range])
                .map(|record| (lsn, record))
                .map_err(|source| Error::Codec {
                    lsn: Some(lsn),
                    source,
                });
            failed = item.is_err();
            decoded.push(item);
            if failed {
                break;
            }
        }
        if !failed {
            if let Some(error) = batch.error {
                decoded.push(Err(error));
            }
        }
        if output.send(decoded).is_err() {
            return;
        }
    }
}

impl<T> Iterator for ParIter<T> {
    type Item = Result<(Lsn, T)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(item) = self.current.next() {
                if item.is_err() {
                    self.finish();
                }
                return Some(item);
            }
            if self.finished {
                return None;
            }
            let output = &self.outputs[self.next_output];
            self.next_output = (self.next_output + 1) % self.outputs.len();
            match output.recv() {
                Ok(batch) => self.current = batch.into_iter(),
                // The reader ended before dealing a batch to this worker: that was the end.
                Err(_) => self.finish(),
            }
        }
    }
}

impl<T> ParIter<T> {
    /// Stops the threads (closing our ends of the channels) and waits for them.
    fn finish(&mut self) {
        self.finished = true;
        self.outputs.clear();
        for handle in self.threads.drain(..) {
            // A worker that panicked (a codec bug) has nothing left for us; the items already
            // yielded stand.
            let _ = handle.join();
        }
    }
}

impl<T> Drop for ParIter<T> {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use crate::{Codec, Lsn, Wal, WalOptions};

    type Rec = (u32, String);

    fn options() -> WalOptions {
        WalOptions::default()
            .codec(Codec::MessagePack)
            .segment_bytes(64 << 10)
            .verify_on_open(false)
    }

    fn fill(dir: &std::path::Path, n: u32) {
        let wal: Wal<Rec> = Wal::open(dir, options()).unwrap();
        let records: Vec<Rec> = (0..n).map(|i| (i, "x".repeat(i as usize % 300))).collect();
        for chunk in records.chunks(7) {
            wal.append_batch(chunk).unwrap();
        }
        wal.close().unwrap();
    }

    fn render(items: impl Iterator<Item = crate::Result<(Lsn, Rec)>>) -> Vec<String> {
        items
            .map(|item| match item {
                Ok((lsn, rec)) => format!("{lsn} {rec:?}"),
                Err(error) => format!("error: {error}"),
            })
            .collect()
    }

    #[test]
    fn yields_what_the_sequential_iterator_yields() {
        let dir = tempfile::tempdir().unwrap();
        fill(dir.path(), 6000);
        let wal: Wal<Rec> = Wal::open(dir.path(), options()).unwrap();
        for from in [1, 2, 1000, 5999, 6000, 6001, 9000] {
            let expected = render(wal.iter_from(Lsn::new(from)).unwrap());
            for threads in [1, 2, 3] {
                let got = render(wal.par_iter_from(Lsn::new(from), threads).unwrap());
                assert_eq!(got, expected, "from {from} with {threads} threads");
            }
        }
    }

    #[test]
    fn stops_at_damage_like_the_sequential_iterator() {
        let dir = tempfile::tempdir().unwrap();
        fill(dir.path(), 6000);
        let wal: Wal<Rec> = Wal::open(dir.path(), options()).unwrap();
        let second = wal.log().segments()[1].path.clone();
        drop(wal);
        let mut bytes = std::fs::read(&second).unwrap();
        bytes[5000] ^= 0x40; // inside a record of a sealed segment
        std::fs::write(&second, bytes).unwrap();
        let wal: Wal<Rec> = Wal::open(dir.path(), options()).unwrap();
        let expected = render(wal.iter().unwrap());
        assert!(
            expected.last().unwrap().starts_with("error: "),
            "{expected:?}"
        );
        for threads in [1, 2, 4] {
            assert_eq!(
                render(wal.par_iter_from(Lsn::FIRST, threads).unwrap()),
                expected
            );
        }
    }

    #[test]
    fn dropping_early_stops_the_threads() {
        let dir = tempfile::tempdir().unwrap();
        fill(dir.path(), 6000);
        let wal: Wal<Rec> = Wal::open(dir.path(), options()).unwrap();
        for taken in [0, 1, 3000] {
            let mut iter = wal.par_iter_from(Lsn::FIRST, 2).unwrap();
            for _ in 0..taken {
                iter.next().unwrap().unwrap();
            }
            drop(iter); // joins its threads: a hang here fails the test by timeout
        }
    }
}
