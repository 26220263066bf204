//! Term and epoch fencing on the standby: which streams may write this node's copies, and how
//! the primary's terms enter a copy's history.
//!
//! Invariants:
//! - **Epochs only go up.** A stream of an epoch older than this node's is refused, and a
//!   message of one ends its stream; a primary of a newer epoch makes this node, if it is the
//!   primary, step down ([`check_epoch`]).
//! - **Terms only go up.** A message of a term below the copy's ends the stream
//!   ([`check_message`]); a term enters the history at or after the last entry, never below it
//!   ([`adopt_terms`]), so both nodes label every record alike.

use crate::cluster::Node;
use crate::replication::SessionEnd;
use stela_format::term::Term;
use stela_wal::TermStore;

/// Whether a stream of `term` from `primary` may be mirrored by this node: not while this
/// node is the primary (a primary of a newer epoch makes it step down), not from an epoch older
/// than this node's, nor from a second node in one epoch (`Node::accept_stream`; a newer epoch
/// is recorded first).
pub(super) fn check_epoch(node: &Node, term: u64, primary: &str) -> Result<(), SessionEnd> {
    if !node.clustered_node() {
        return Ok(());
    }
    let (theirs, ours) = (term >> 32, node.epoch());
    if !node.is_primary() {
        node.accept_stream(theirs, primary)
            .map_err(|e| SessionEnd::Fenced(e.to_string()))?;
        node.heard_from_primary();
        return Ok(());
    }
    if theirs > ours {
        node.step_down(format!(
            "{primary} ships as the primary of epoch {theirs}, this node is in epoch {ours}"
        ));
        return Err(SessionEnd::Fenced(format!(
            "this node was the primary of epoch {ours} and is stepping down; retry"
        )));
    }
    Err(SessionEnd::Fenced(format!(
        "this node is the primary of epoch {ours}; {primary} (epoch {theirs}) is not"
    )))
}

/// Whether a message of `term` may still be taken on a stream: a standby that has seen a newer
/// epoch (another node's stream, a promotion) never acknowledges again in an older one, and a
/// term below the copy's is stale.
pub(super) fn check_message(node: &Node, terms: &TermStore, term: u64) -> Result<(), SessionEnd> {
    if term >> 32 < node.epoch() {
        return Err(SessionEnd::Fenced(format!(
            "epoch {} is over: this node is in epoch {}",
            term >> 32,
            node.epoch()
        )));
    }
    if term < terms.current().0 {
        return Err(SessionEnd::Fenced(format!(
            "stale term {term}: this standby is at term {}",
            terms.current().0
        )));
    }
    Ok(())
}

/// Records the primary's terms that begin at or before `next` (the LSN after what this copy
/// holds, or will once the chunk in hand is held) and after this copy's last term, at the first
/// LSNs the primary's history gives them, so that both histories label every record alike and
/// a commit in doubt resolves the same on either node.
pub(super) fn adopt_terms(
    terms: &mut TermStore,
    primary: &[(u64, u64)],
    next: u64,
) -> Result<(), SessionEnd> {
    for &(term, first) in primary {
        if Term(term) > terms.history().last_term() && first <= next {
            // A copy labelled by an older standby may have an entry past `first`; the new term
            // then begins at that entry (a history never goes back).
            let last_first = terms.history().entries().last().map_or(1, |e| e.1);
            let first = first.max(last_first);
            // Adopted, not begun: the stream's own term, already observed, may be newer
            // (the primary began more than one term while this copy was away).
            terms.adopt(Term(term), first).map_err(|e| {
                SessionEnd::Storage(format!(
                    "recording the primary's term {term} from LSN {first}: {e}"
                ))
            })?;
            debug_assert!(terms.history().last_term() >= Term(term));
        }
    }
    Ok(())
}

/// A chunk of `chunk_term` from a primary that sends no history (an older one) begins its term
/// where the chunk starts (`before`), if the copy has not got it yet.
pub(super) fn begin_from_chunk(
    terms: &mut TermStore,
    chunk_term: u64,
    before: u64,
) -> Result<(), SessionEnd> {
    if terms.history().last_term() < Term(chunk_term) {
        terms
            .observe(Term(chunk_term))
            .and_then(|()| terms.begin(Term(chunk_term), before))?;
    }
    Ok(())
}
