//! The client's end of a ring: it writes entries into free space, publishes them with one store
//! of `tail`, rings the doorbell only when the daemon sleeps, and waits for completions by
//! spinning briefly, then sleeping on the `wake` futex.
//!
//! Invariants:
//! - **Only free space is written.** An entry (and a pad before it) goes into
//!   `[tail, head + data_bytes)`, where `head` was loaded (Acquire) after the daemon finished
//!   copying everything below it, so the daemon never reads bytes while they are written.
//! - **Published means complete.** `tail` moves (Release) only past whole entries, so the daemon
//!   sees either all of an entry or none of it; a client killed mid-write leaves only unpublished
//!   bytes, which the daemon never reads.
//! - **No lost wake-ups, either way.** After publishing: SeqCst fence, then read
//!   `daemon_asleep`; the daemon sets it, fences, then re-reads `tail`. Before sleeping: read
//!   `wake`, set `client_waiting`, SeqCst fence, re-check; the daemon changes what the client
//!   waits for, bumps `wake`, fences, then reads `client_waiting`. In both pairs at least one
//!   side sees the other's store, and FUTEX_WAIT returns at once if `wake` moved since it was
//!   read. A client with a seat on a wake board sleeps for answers on its board word instead,
//!   with the same steps on that word (`board.rs`).
//! - **Results are read before their slot can be reused.** At most `slots` entries are in
//!   flight: entry `s` is written only once `s - slots` is completed and its result copied out.
//! - **Nothing is waited for that is not published** (that would wait forever): every wait
//!   publishes what was written first.

use super::board::{Board, Seat};
use super::error::ShmError;
use super::region::{Doorbell, Region};
use super::sync::{crash_point, fence, Arc, AtomicBool};
use std::fmt;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::time::{Duration, Instant};
use stela_proto::ring::{
    check_entry, decode_message, decode_result, encode_entry, pad_bytes, BoardSeat, Completion,
    EntryHeader, EntryKind, RingError, RingLayout, WAITING_FOR_ANSWER, WAITING_FOR_ROOM,
    WAITING_ON_BOARD,
};
use stela_proto::Durability;

/// After this many sleeping waits at a spin budget of zero, the full budget is tried again.
pub const REPROBE_EVERY: u32 = 64;

/// Tells a client that its daemon is gone, from another thread (the connection watcher, which
/// sees the daemon's socket hang up). Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct GoneHandle {
    region: Region,
    gone: Arc<AtomicBool>,
    seat: Option<Seat>,
}

impl GoneHandle {
    /// Marks the daemon gone and wakes the client if it sleeps: every wait then returns
    /// [`ShmError::DaemonGone`] at once (after any completion already published). `wake` is
    /// bumped before FUTEX_WAKE so that a client between reading `wake` and sleeping cannot
    /// miss it.
    pub fn mark_gone(&self) {
        self.gone.store(true, Release);
        self.region.wake().fetch_add(1, Release);
        self.region.futex_wake();
        if let Some(seat) = &self.seat {
            seat.board.wake(seat.seat);
        }
    }

    pub fn is_gone(&self) -> bool {
        self.gone.load(Acquire)
    }
}

impl fmt::Debug for GoneHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GoneHandle")
            .field("gone", &self.is_gone())
            .finish()
    }
}

/// The adaptive spin of a waiting client, as in [`crate::SpinStream`]: a wait that the spin
/// does not satisfy halves the budget, down to zero; at zero, every [`REPROBE_EVERY`] sleeping
/// waits the full budget is tried again.
#[derive(Clone, Copy, Debug)]
struct Spin {
    max: Duration,
    budget: Duration,
    sleeping_waits: u32,
}

impl Spin {
    fn missed(&mut self) {
        self.budget /= 2;
        if self.budget < Duration::from_micros(2) {
            self.budget = Duration::ZERO;
        }
    }

    fn slept(&mut self) {
        if self.budget.is_zero() && !self.max.is_zero() {
            self.sleeping_waits += 1;
            if self.sleeping_waits >= REPROBE_EVERY {
                self.sleeping_waits = 0;
                self.budget = self.max;
            }
        }
    }
}

/// The client's end of one connection's ring. One thread uses it (`&mut self`); another may
/// hold its [`GoneHandle`].
pub struct ClientRing {
    region: Region,
    layout: RingLayout,
    doorbell: Doorbell,
    gone: Arc<AtomicBool>,
    /// Where answers are waited for, if the daemon gave the ring a seat on a wake board.
    seat: Option<Seat>,
    /// Bytes written, published or not: where the next entry goes.
    written: u64,
    /// The last value stored to `tail`.
    published: u64,
    next_seq: u64,
    /// Every result up to this seq was copied out of its slot into `results`.
    harvested: u64,
    /// Copied results, at `seq mod slots`, tagged with their seq.
    results: Vec<(u64, Completion)>,
    spin: Spin,
}

impl fmt::Debug for ClientRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientRing")
            .field("layout", &self.layout)
            .field("written", &self.written)
            .field("published", &self.published)
            .field("next_seq", &self.next_seq)
            .field("spin", &self.spin)
            .finish()
    }
}

impl ClientRing {
    pub(crate) fn from_parts(region: Region, doorbell: Doorbell, spin: Duration) -> ClientRing {
        let layout = region.layout();
        ClientRing {
            region,
            layout,
            doorbell,
            gone: Arc::new(AtomicBool::new(false)),
            seat: None,
            written: 0,
            published: 0,
            next_seq: 1,
            harvested: 0,
            results: vec![(0, Completion::default()); layout.slots as usize],
            spin: Spin {
                max: spin,
                budget: spin,
                sleeping_waits: 0,
            },
        }
    }

    /// Opens the client's end from the descriptors the daemon sent: checks that the memfd is
    /// sealed against resizing and as large as its header says, maps it, checks the header
    /// (magic, version, sizes) and that the ring is fresh. Spins up to
    /// [`crate::DEFAULT_SPIN`] per wait; see [`ClientRing::set_spin`].
    ///
    /// # Errors
    /// [`ShmError::Unsealed`], [`ShmError::Layout`] (a bad header or a size that does not
    /// match it), [`ShmError::Inconsistent`] for a ring already in use, [`ShmError::Io`].
    #[cfg(not(stela_loom))]
    pub fn from_fds(
        memfd: std::os::fd::OwnedFd,
        eventfd: std::os::fd::OwnedFd,
    ) -> Result<ClientRing, ShmError> {
        use super::os;
        use std::os::fd::AsFd;
        use stela_proto::ring::{HEADER_BYTES, MAX_DATA_BYTES};
        let size = super::os::sealed_size(memfd.as_fd())?;
        if size < HEADER_BYTES as u64 || size > HEADER_BYTES as u64 + MAX_DATA_BYTES {
            return Err(ShmError::Layout(RingError::BadRegionSize {
                found: size,
                expected: HEADER_BYTES as u64,
            }));
        }
        let map = os::Mapping::map(memfd.as_fd(), size as usize).map_err(ShmError::io("mmap"))?;
        let layout = RingLayout::parse(&Region::line0_of(&map)).map_err(ShmError::Layout)?;
        if layout.region_bytes() != size {
            return Err(ShmError::Layout(RingError::BadRegionSize {
                found: size,
                expected: layout.region_bytes(),
            }));
        }
        let region = Region::new(map, layout);
        for (what, value) in [
            ("tail", region.tail().load(Acquire)),
            ("done_seq", region.done_seq().load(Acquire)),
            ("fault", u64::from(region.fault().load(Acquire))),
        ] {
            if value != 0 {
                return Err(ShmError::Inconsistent {
                    what,
                    value,
                    limit: 0,
                });
            }
        }
        Ok(ClientRing::from_parts(
            region,
            Doorbell::new(eventfd),
            crate::DEFAULT_SPIN,
        ))
    }

    pub fn layout(&self) -> RingLayout {
        self.layout
    }

    /// The most a wait spins before it sleeps (zero: never spin). Resets the adaptive budget.
    pub fn set_spin(&mut self, max: Duration) {
        self.spin = Spin {
            max,
            budget: max,
            sleeping_waits: 0,
        };
    }

    /// The budget the next wait will spin for.
    pub fn spin_budget(&self) -> Duration {
        self.spin.budget
    }

    /// Sleeps for answers on the ring's seat of `board` (the wake board the daemon sent with
    /// the ring) from now on; returns false, and keeps sleeping on `wake`, if the ring has no
    /// seat. Call before [`ClientRing::gone_handle`].
    pub fn attach_board(&mut self, board: Board) -> bool {
        let Some(seat) = BoardSeat::decode(self.region.board_seat().load(Relaxed)) else {
            return false;
        };
        self.seat = Some(Seat { board, seat });
        true
    }

    /// A handle for the thread that watches the daemon's socket.
    pub fn gone_handle(&self) -> GoneHandle {
        GoneHandle {
            region: self.region.clone(),
            gone: self.gone.clone(),
            seat: self.seat.clone(),
        }
    }

    /// See [`GoneHandle::mark_gone`].
    pub fn mark_gone(&self) {
        self.gone_handle().mark_gone();
    }

    /// The largest entry this ring can carry (the data area); a larger one goes by socket.
    pub fn max_entry_bytes(&self) -> usize {
        self.layout.data_bytes as usize
    }

    /// The seq the next entry will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Writes one entry and publishes it (and anything written before). Returns its seq, to
    /// [`ClientRing::wait`] for.
    ///
    /// # Errors
    /// As [`ClientRing::write_entry`] and [`ClientRing::publish`].
    pub fn submit(
        &mut self,
        handle: u32,
        kind: EntryKind,
        durability: Durability,
        lsn: u64,
        payloads: &[&[u8]],
    ) -> Result<u64, ShmError> {
        let seq = self.write_entry(handle, kind, durability, lsn, payloads)?;
        self.publish()?;
        Ok(seq)
    }

    /// Writes one entry into the ring without publishing it (several written entries are
    /// published together by [`ClientRing::publish`]). Waits, spinning then sleeping, while the
    /// area has no room for it or `slots` entries are in flight; before waiting it publishes
    /// what was written, since only published entries make room.
    ///
    /// # Errors
    /// [`ShmError::EntryTooLarge`] if the entry can never fit (send it by socket);
    /// [`ShmError::BadEntry`] if the payloads do not fit the kind (an append needs at least one,
    /// a commit none; an append has no `lsn`); [`ShmError::Faulted`] once the daemon stopped
    /// reading the ring; [`ShmError::DaemonGone`].
    pub fn write_entry(
        &mut self,
        handle: u32,
        kind: EntryKind,
        durability: Durability,
        lsn: u64,
        payloads: &[&[u8]],
    ) -> Result<u64, ShmError> {
        let header = EntryHeader {
            handle,
            kind,
            durability,
            lsn,
        };
        let seq = self.next_seq;
        // A stopped ring or a dead daemon refuses at once, even when there is room.
        self.hopeless(seq, &mut |_| false)?;
        let data_bytes = self.layout.data_bytes;
        let len = match check_entry(seq, &header, payloads) {
            Ok(len) if len as u64 <= data_bytes => len as u64,
            Ok(len) => {
                return Err(ShmError::EntryTooLarge {
                    len: len as u64,
                    max: data_bytes,
                })
            }
            Err(RingError::EntryTooLarge { len, .. }) => {
                return Err(ShmError::EntryTooLarge {
                    len,
                    max: data_bytes,
                })
            }
            Err(error) => return Err(ShmError::BadEntry(error)),
        };
        let position = self.layout.position(self.written) as u64;
        let pad = if position + len > data_bytes {
            data_bytes - position
        } else {
            0
        };
        let slots = u64::from(self.layout.slots);
        let end = self.written + pad + len;
        self.wait_until(seq, true, WAITING_FOR_ROOM, |ring| {
            // (`head` never passes `tail`; a daemon that broke that would only make us wait.)
            let room = end.wrapping_sub(ring.region.head().load(Acquire)) <= data_bytes;
            let slot_free = seq <= slots || ring.region.done_seq().load(Acquire) >= seq - slots;
            room && slot_free
        })?;
        if seq > slots {
            self.harvest(seq - slots)?;
        }
        crash_point();
        if pad > 0 {
            self.region.write_data(position as usize, 8, |bytes| {
                bytes[..4].copy_from_slice(&pad_bytes());
                bytes[4..].fill(0);
            });
            crash_point();
        }
        let at = self.layout.position(self.written + pad);
        self.region
            .write_data(at, len as usize, |bytes| {
                encode_entry(bytes, seq, &header, payloads)
            })
            .map_err(ShmError::BadEntry)?;
        crash_point();
        self.written = end;
        self.next_seq += 1;
        Ok(seq)
    }

    /// Publishes every entry written so far (one Release store of `tail`) and rings the
    /// doorbell if the daemon sleeps.
    ///
    /// # Errors
    /// [`ShmError::Io`] if the doorbell cannot be rung (a broken descriptor).
    pub fn publish(&mut self) -> Result<(), ShmError> {
        if self.written == self.published {
            return Ok(());
        }
        self.region.tail().store(self.written, Release);
        self.published = self.written;
        crash_point();
        fence(SeqCst);
        if self.region.daemon_asleep().load(Relaxed) != 0 {
            self.doorbell
                .ring()
                .map_err(ShmError::io("write eventfd"))?;
            crash_point();
        }
        Ok(())
    }

    /// Waits for the daemon's answer to entry `seq` (publishing it first if need be): spins up
    /// to the adaptive budget, then sleeps on the `wake` futex.
    ///
    /// The answer of an entry stays available until `slots` later entries have been waited
    /// for or written; wait for entries in order, at most `slots` behind.
    ///
    /// # Errors
    /// [`ShmError::Faulted`] if the daemon stopped reading the ring before this entry;
    /// [`ShmError::DaemonGone`] once [`GoneHandle::mark_gone`] was called and the answer is not
    /// there; [`ShmError::NotSubmitted`], [`ShmError::ResultGone`] for a seq this ring cannot
    /// answer; [`ShmError::Inconsistent`] if the daemon broke the protocol.
    pub fn wait(&mut self, seq: u64) -> Result<Completion, ShmError> {
        self.wait_for(seq, true)
    }

    /// As [`ClientRing::wait`], without spinning first, and without letting the wait teach the
    /// spin budget anything: for an answer known to take long (a `disk` entry waits for an
    /// fdatasync), where spinning would only take the CPU from the daemon.
    pub fn wait_patiently(&mut self, seq: u64) -> Result<Completion, ShmError> {
        self.wait_for(seq, false)
    }

    fn wait_for(&mut self, seq: u64, spin: bool) -> Result<Completion, ShmError> {
        if seq == 0 || seq >= self.next_seq {
            return Err(ShmError::NotSubmitted {
                seq,
                next: self.next_seq,
            });
        }
        if seq > self.harvested {
            self.wait_until(seq, spin, WAITING_FOR_ANSWER, |ring| {
                ring.region.done_seq().load(Acquire) >= seq
            })?;
            self.harvest(seq)?;
        }
        let (stored, completion) = self.results[self.slot_index(seq)];
        if stored != seq {
            return Err(ShmError::ResultGone { seq });
        }
        Ok(completion)
    }

    /// The daemon's explanation of its refusal of entry `seq`, if it is still there (it is
    /// until the daemon refuses another entry).
    pub fn refusal_message(&self, seq: u64) -> Option<String> {
        let (stored, text) = decode_message(&self.region.read_message());
        (stored == seq).then_some(text)
    }

    fn slot_index(&self, seq: u64) -> usize {
        (seq & u64::from(self.layout.slots - 1)) as usize
    }

    /// Copies the results of `harvested + 1 ..= up_to` (all completed) out of their slots.
    fn harvest(&mut self, up_to: u64) -> Result<(), ShmError> {
        let done = self.region.done_seq().load(Acquire);
        if done >= self.next_seq {
            return Err(ShmError::Inconsistent {
                what: "done_seq",
                value: done,
                limit: self.next_seq - 1,
            });
        }
        while self.harvested < up_to {
            let seq = self.harvested + 1;
            let (stored, completion) = decode_result(&self.region.read_result(seq));
            if stored != seq {
                return Err(ShmError::Inconsistent {
                    what: "result slot seq",
                    value: stored,
                    limit: seq,
                });
            }
            let index = self.slot_index(seq);
            self.results[index] = (seq, completion);
            self.harvested = seq;
        }
        Ok(())
    }

    /// Why a wait for entry `seq` can never succeed, if it cannot: the daemon stopped at or
    /// before it, or is gone. `ready` is checked once more after either is seen, so an answer
    /// the daemon published before it stopped or died is still returned (the stop and the gone
    /// flag are stored with Release after it, and loaded here with Acquire).
    fn hopeless(
        &self,
        seq: u64,
        ready: &mut impl FnMut(&ClientRing) -> bool,
    ) -> Result<bool, ShmError> {
        let code = self.region.fault().load(Acquire);
        let fault_seq = match code {
            0 => u64::MAX,
            _ => self.region.fault_seq().load(Relaxed),
        };
        let error = if seq >= fault_seq {
            ShmError::Faulted {
                code,
                fault_seq,
                seq,
            }
        } else if self.gone.load(Acquire) {
            ShmError::DaemonGone
        } else {
            return Ok(false);
        };
        if ready(self) {
            Ok(true)
        } else {
            Err(error)
        }
    }

    /// Waits until `ready` holds, for entry `seq`: publishes first, spins up to the budget,
    /// then sleeps on `wake` (see the module's wake-up invariant), announcing `waiting_for`
    /// ([`WAITING_FOR_ROOM`] if `ready` reads `head`, else [`WAITING_FOR_ANSWER`]). Checked in
    /// this order each time: `ready`, then whether the daemon stopped before `seq` or is gone
    /// ([`ClientRing::hopeless`]).
    fn wait_until(
        &mut self,
        seq: u64,
        spin: bool,
        waiting_for: u32,
        mut ready: impl FnMut(&ClientRing) -> bool,
    ) -> Result<(), ShmError> {
        if ready(self) || self.hopeless(seq, &mut ready)? {
            return Ok(());
        }
        self.publish()?;
        if !spin {
            // A patient wait: straight to sleep, the spin budget left as it was.
        } else if !self.spin.budget.is_zero() {
            let started = Instant::now();
            let mut spins = 0u32;
            loop {
                std::hint::spin_loop();
                if ready(self) {
                    return Ok(());
                }
                spins += 1;
                if spins.is_multiple_of(32) {
                    if self.hopeless(seq, &mut ready)? {
                        return Ok(());
                    }
                    if started.elapsed() >= self.spin.budget {
                        self.spin.missed();
                        break;
                    }
                }
            }
        } else {
            self.spin.slept();
        }
        // Answers are waited for on the board seat, if the ring has one; room always on `wake`.
        let board = self
            .seat
            .as_ref()
            .filter(|_| waiting_for == WAITING_FOR_ANSWER);
        let announced = match board {
            Some(_) => WAITING_ON_BOARD,
            None => waiting_for,
        };
        loop {
            let seen = match board {
                Some(seat) => seat.board.seen(seat.seat),
                None => self.region.wake().load(Acquire),
            };
            self.region.client_waiting().store(announced, Relaxed);
            fence(SeqCst);
            let outcome = if ready(self) {
                Ok(true)
            } else {
                self.hopeless(seq, &mut ready)
            };
            if !matches!(outcome, Ok(false)) {
                self.region.client_waiting().store(0, Relaxed);
                return outcome.map(|_| ());
            }
            match board {
                Some(seat) => seat.board.futex_wait(seat.seat, seen),
                None => self.region.futex_wait(seen),
            }
            self.region.client_waiting().store(0, Relaxed);
        }
    }

    /// Writes `value` over the data word at `position`: the model's wild write.
    #[cfg(stela_loom)]
    pub fn model_scribble(&self, position: usize, value: u64) {
        self.region.scribble(position, value);
    }
}
