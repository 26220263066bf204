//! Before a log opens on a primary that crashed: fetching back from the standby the records it
//! holds that this primary lost (acknowledged at `replicated`, not yet on this disk).
//!
//! Invariants:
//! - **Only what agrees.** Records are fetched only when the standby's copy extends this one
//!   in the same history (no divergence before this copy's end), and only in this node's own
//!   epoch; every fetched chunk is checked by the mirror as shipping checks it.

use super::wire::{receive, send};
use super::{Reader, Replication, SessionEnd};
use std::io::BufReader;
use std::sync::Arc;
use stela_format::term::Term;
use stela_format::Lsn;
use stela_proto::repl::ReplMessage;
use stela_wal::mirror::Mirror;
use stela_wal::TermStore;

impl Replication {
    /// Before `log` is opened (its files in `dir`): if the standby holds records of it that this
    /// primary lost (it crashed after acknowledging them at `replicated`), fetches them into the
    /// files, so that the log opens with every acknowledged record. Returns how many records
    /// came back. Does nothing when the standby is unreachable, not ahead, or diverged (shipping
    /// then reports it).
    pub fn catch_up(
        &self,
        log: &str,
        dir: &std::path::Path,
        type_tag: &str,
        options: stela_wal::WalOptions,
    ) -> Result<u64, SessionEnd> {
        let storage = Arc::clone(&options.storage);
        let codec = options.codec;
        if storage.list(dir).map_or(true, |names| names.is_empty()) {
            return Ok(0);
        }
        let terms = TermStore::open(Arc::clone(&storage), dir)?;
        if terms.current() == Term(0) {
            return Ok(0); // never replicated
        }
        if terms.current().0 >> 32 != self.epoch() {
            // This node was not the primary of the log's last term (it was promoted since):
            // its peer can hold no record it acknowledged that this copy lacks.
            return Ok(0);
        }
        let term = terms.current().0;
        let mut mirror = Mirror::open(dir, options, type_tag)?;
        let opened = self.open_stream(log, codec, type_tag, term, terms.history());
        let (mut reader, mut writer, _socket, theirs) = match opened {
            Ok(stream) => stream,
            Err(refused @ SessionEnd::Refused { .. }) => return Err(refused),
            Err(why) => {
                tracing::warn!(log, standby = %self.standby, why = %why, "standby unreachable at open: records it may hold that this primary lost are not fetched");
                return Ok(0);
            }
        };
        let their_end = theirs.end();
        let ours_end = mirror.received_lsn();
        let agreed = stela_format::term::divergence(
            (terms.history(), ours_end),
            (&theirs.history, their_end),
        );
        if their_end <= ours_end || agreed < ours_end {
            return Ok(0);
        }
        debug_assert!(
            agreed >= ours_end,
            "only a copy that extends this one is fetched from"
        );
        let at = mirror.position();
        let fetch = ReplMessage::Fetch {
            term,
            segment_start: at.segment_start.get(),
            offset: at.offset,
            next_lsn: at.next_lsn.get(),
        };
        send(&mut writer, &fetch)?;
        let bytes_back = fetch_into(&mut mirror, &mut reader)?;
        mirror.sync()?;
        debug_assert!(
            mirror.received_lsn() >= ours_end,
            "fetching only adds records"
        );
        let fetched = mirror.received_lsn() - ours_end;
        tracing::warn!(
            log,
            fetched,
            bytes = bytes_back,
            from = ours_end + 1,
            "fetched from the standby the records this primary lost"
        );
        Ok(fetched)
    }
}

/// Takes the chunks a `Fetch` brings back into `mirror` (which checks each), until the
/// standby's `Position`; returns their bytes.
fn fetch_into(mirror: &mut Mirror, reader: &mut BufReader<Reader>) -> Result<u64, SessionEnd> {
    let mut bytes_back = 0u64;
    loop {
        match receive(reader)? {
            ReplMessage::Chunk {
                segment_start,
                offset,
                raw_len,
                compressed,
                bytes,
                ..
            } => {
                let bytes = stela_proto::repl::chunk_bytes(raw_len, compressed, bytes)
                    .map_err(SessionEnd::protocol)?;
                bytes_back += bytes.len() as u64;
                mirror.apply(stela_wal::mirror::Chunk {
                    segment_start: Lsn::new(segment_start),
                    offset,
                    bytes: &bytes,
                })?;
            }
            ReplMessage::Position { .. } => return Ok(bytes_back),
            ReplMessage::Refuse { term, message } => {
                return Err(SessionEnd::Refused { term, message })
            }
            other => {
                return Err(SessionEnd::Protocol(format!(
                    "unexpected {other:?} while fetching"
                )))
            }
        }
    }
}
