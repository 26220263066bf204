//! What `stela status` shows of a primary's replication: each log's standby, what it holds,
//! how far behind it is (in records, bytes and time), and the policies in force.
//!
//! Invariants:
//! - **Lock order.** A link's protection is read before its state is locked (a wait takes
//!   them the other way round); the node's state is read before the links.

use super::{Replication, LINK_DEADLINE};
use crate::pool::LogId;
use crate::sync::lock;
use stela_wal::SegmentSet;

impl Replication {
    /// Where each log's standby stands, for `stela status`; `end` gives a log's newest LSN and
    /// where its next frame goes ([`crate::pool::Pool::append_place`]).
    pub fn status(
        &self,
        end: impl Fn(LogId) -> (u64, Option<(u64, u64, u64)>),
    ) -> stela_proto::ReplicationStatus {
        // The node's state first: a node that reads as protected again already has each
        // standby's acknowledgement of what it acknowledged without one, which the logs, read
        // after, show.
        let (role, epoch, coordinator, last_failover, unprotected_since_ms) = self.node.status();
        let mut logs: Vec<stela_proto::ReplicaStatus> = lock(&self.links)
            .iter()
            .map(|(&id, link)| {
                // The protection's lock is never taken under the link state's (a wait takes
                // them the other way round).
                let (received, standby_durable) = link.protection.acknowledged_lsns();
                let stopped = link.protection.fenced();
                let (last_lsn, place) = end(id);
                let s = lock(&link.state);
                let lag_records = last_lsn.saturating_sub(received);
                let lag_bytes = match place {
                    Some(place) if lag_records > 0 => {
                        // Never connected: the standby is known to hold nothing of the log.
                        let from = s.acked_at.unwrap_or_else(|| {
                            let first = link.segments.list().first().map(|f| f.start.get());
                            (first.unwrap_or(place.0), 0)
                        });
                        bytes_between(&link.segments, from, place)
                    }
                    _ => 0,
                };
                stela_proto::ReplicaStatus {
                    log: link.name.clone(),
                    connected: s.connected,
                    term: s.term,
                    received_lsn: received,
                    durable_lsn: standby_durable,
                    lag_records,
                    lag_bytes,
                    lag_ms: if lag_records > 0 {
                        s.last_ack.map_or(0, |at| at.elapsed().as_millis() as u64)
                    } else {
                        0
                    },
                    stopped,
                    shipped_bytes: s.shipped_bytes,
                    wire_bytes: s.wire_bytes,
                    degraded: s.degraded,
                    degraded_acks: s.degraded_acks,
                    degraded_through: s.degraded_through,
                    unprotected_acks: s.unprotected_acks,
                    stalled: s.connected
                        && s.last_ack.is_some_and(|at| at.elapsed() > LINK_DEADLINE),
                    last_ack_ms: s.last_ack.map_or(0, |at| at.elapsed().as_millis() as u64),
                    last_end: self.ends.last(&link.name),
                }
            })
            .collect();
        logs.sort_by(|a, b| a.log.cmp(&b.log));
        stela_proto::ReplicationStatus {
            role: role.into(),
            peer: self.standby.to_string(),
            logs,
            epoch,
            coordinator,
            last_failover,
            unprotected_since_ms,
            standbys: Vec::new(),
            replicas: 0,
            session_ends: self.ends.counts(),
            ended_streams: Vec::new(),
        }
    }
}

/// Segment bytes from `from` (segment, offset) to `to` (segment, offset, capacity): within one
/// segment the offsets' difference; across segments the rest of `from`'s segment, the segments
/// between as their files list them (a segment counts its capacity), and `to`'s offset.
fn bytes_between(segments: &SegmentSet, from: (u64, u64), to: (u64, u64, u64)) -> u64 {
    let ((from_segment, from_offset), (to_segment, to_offset, capacity)) = (from, to);
    if from_segment >= to_segment {
        return to_offset.saturating_sub(from_offset);
    }
    let between = segments
        .list()
        .iter()
        .filter(|file| (from_segment + 1..to_segment).contains(&file.start.get()))
        .count() as u64;
    capacity.saturating_sub(from_offset) + between * capacity + to_offset
}
