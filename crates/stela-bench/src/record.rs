//! The record of the paper's benchmark (Listing 2) and a deterministic generator.
//!
//! Records are generated from a seed with a SplitMix64 stream ([`stela::drive::SplitMix64`],
//! rather than `rand`'s `StdRng`, whose algorithm may change between versions), so a seed names
//! the same records on every machine and every build.
//!
//! With the default generator a record is about 113 bytes as MessagePack (the paper reports
//! ~116 B/record) and about 300 bytes as JSON (the paper: ~297 B/record): a comment of 16 to 40
//! characters and 7 to 11 objects of two integers.

use serde::{Deserialize, Serialize};
use stela_format::Codec;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Data {
    pub a: u32,
    pub b: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Record {
    pub id: u32,
    pub comment: String,
    pub objects: Vec<Data>,
}

/// The seeded generator of every record here; the product's demo draws from the same one.
pub use stela::drive::SplitMix64;

const WORDS: &[&str] = &[
    "debit",
    "credit",
    "account",
    "balance",
    "transfer",
    "ledger",
    "posted",
    "pending",
    "refund",
    "invoice",
    "order",
    "shipped",
    "customer",
    "branch",
    "audit",
    "batch",
    "fee",
    "interest",
    "deposit",
    "withdrawal",
    "settled",
    "hold",
    "review",
    "monthly",
];

/// A comment of exactly `len` characters made of words (ASCII, so bytes = characters).
fn comment(rng: &mut SplitMix64, len: usize) -> String {
    let mut text = String::with_capacity(len + 12);
    while text.len() < len {
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(WORDS[rng.between(0, WORDS.len() as u64 - 1) as usize]);
    }
    text.truncate(len);
    text
}

/// `n` records with ids `0..n`, the same for the same `seed`.
pub fn make_records(n: usize, seed: u64) -> Vec<Record> {
    let mut rng = SplitMix64::new(seed);
    (0..n)
        .map(|i| {
            let comment_len = rng.between(16, 40) as usize;
            let comment = comment(&mut rng, comment_len);
            let objects = (0..rng.between(7, 11))
                .map(|_| Data {
                    a: rng.between(0, u64::from(u16::MAX)) as u32,
                    b: rng.next_u64() as u32,
                })
                .collect();
            Record {
                id: i as u32,
                comment,
                objects,
            }
        })
        .collect()
}

/// `n` records whose MessagePack encoding is `msgpack_bytes` long (or as close as a record with
/// an empty comment allows: about 20 bytes): two objects and a comment sized to fit. Used for
/// the "fixed-size record" runs (e.g. group commit of 100-byte records). Other codecs encode the
/// same records to other sizes (JSON larger, postcard smaller).
pub fn make_sized_records(n: usize, seed: u64, msgpack_bytes: usize) -> Vec<Record> {
    let mut rng = SplitMix64::new(seed);
    (0..n)
        .map(|i| {
            let objects = (0..2)
                .map(|_| Data {
                    a: rng.between(0, u64::from(u16::MAX)) as u32,
                    b: rng.next_u64() as u32,
                })
                .collect();
            let mut record = Record {
                id: i as u32,
                comment: String::new(),
                objects,
            };
            // The string header grows at 32 and 256 bytes, so converge in a few steps.
            let mut want = 0usize;
            for _ in 0..4 {
                let len = encoded_len(Codec::MessagePack, &record);
                if len == msgpack_bytes {
                    break;
                }
                want = (want + msgpack_bytes).saturating_sub(len);
                record.comment = comment(&mut rng, want);
            }
            record
        })
        .collect()
}

/// Bytes of `record` encoded with `codec`, exactly as stela and the peer adapters encode it.
pub fn encoded_len(codec: Codec, record: &Record) -> usize {
    codec.encode(record).map(|b| b.len()).unwrap_or(0)
}

/// Total bytes of all `records` encoded with `codec` (the numerator of MB/s).
pub fn payload_bytes(codec: Codec, records: &[Record]) -> u64 {
    let mut buf = Vec::with_capacity(1024);
    records
        .iter()
        .map(|r| {
            buf.clear();
            codec
                .encode_into(r, &mut buf)
                .expect("records always encode");
            buf.len() as u64
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_about_the_papers_size() {
        let a = make_records(2000, 7);
        assert_eq!(a, make_records(2000, 7));
        assert_ne!(a, make_records(2000, 8));
        let mp = payload_bytes(Codec::MessagePack, &a) as f64 / 2000.0;
        let json = payload_bytes(Codec::Json, &a) as f64 / 2000.0;
        assert!((90.0..130.0).contains(&mp), "msgpack {mp} B/record");
        assert!((230.0..340.0).contains(&json), "json {json} B/record");
    }

    #[test]
    fn sized_records_hit_the_size() {
        for size in [40, 100, 300, 1000] {
            for r in make_sized_records(300, 1, size) {
                assert_eq!(encoded_len(Codec::MessagePack, &r), size);
            }
        }
    }
}
