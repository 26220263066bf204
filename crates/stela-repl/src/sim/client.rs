//! A client: commits at `replicated` to the node it believes primary, moves on when told
//! `NotPrimary`, and resolves every commit left in doubt (or answered `Unprotected`) by asking
//! node after node until one that may answer does. Every answer is recorded for the checker.

use crate::log::{Lsn, Resolution, Term};
use crate::msg::{ClientId, NodeId, Reply, Request, Time};

/// What a client was told about one commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Ok,
    Unprotected,
    InDoubt,
    /// No answer and no position: the client cannot ask about it.
    Unknown,
    Kept,
    Lost,
}

/// One answer, with the record it names.
#[derive(Clone, Copy, Debug)]
pub struct Answered {
    pub client: ClientId,
    pub payload: u64,
    pub term: Term,
    pub lsn: Lsn,
    pub answer: Answer,
    pub at: Time,
}

#[derive(Clone, Debug)]
enum State {
    Idle {
        next_at: Time,
    },
    Committing {
        payload: u64,
        sent: Time,
        appended: Option<(Term, Lsn)>,
    },
    Resolving {
        payload: u64,
        term: Term,
        lsn: Lsn,
        asked: Time,
    },
}

#[derive(Clone, Debug)]
pub struct Client {
    pub id: ClientId,
    nodes: u8,
    target: NodeId,
    seq: u64,
    state: State,
}

/// Timings a client keeps.
#[derive(Clone, Copy, Debug)]
pub struct ClientTimes {
    pub commit_deadline: Time,
    pub timeout: Time,
    pub retry: Time,
}

impl Client {
    pub fn new(id: ClientId, nodes: u8) -> Client {
        Client {
            id,
            nodes,
            target: 0,
            seq: 0,
            state: State::Idle { next_at: 0 },
        }
    }

    fn rotate(&mut self) {
        self.target = (self.target + 1) % self.nodes;
    }

    /// A tick: returns a request to send to a node, and an answer to record.
    pub fn tick(
        &mut self,
        now: Time,
        committing: bool,
        times: ClientTimes,
    ) -> (Option<(NodeId, Request)>, Option<Answered>) {
        match self.state.clone() {
            State::Idle { next_at } if committing && now >= next_at => {
                self.seq += 1;
                let payload = (u64::from(self.id) + 1) << 32 | self.seq;
                self.state = State::Committing {
                    payload,
                    sent: now,
                    appended: None,
                };
                (
                    Some((
                        self.target,
                        Request::Commit {
                            payload,
                            deadline: now + times.commit_deadline,
                        },
                    )),
                    None,
                )
            }
            State::Committing {
                payload,
                sent,
                appended,
            } if now.saturating_sub(sent) >= times.timeout => {
                self.rotate();
                let (term, lsn) = appended.unwrap_or_default();
                let answer = if appended.is_some() {
                    Answer::InDoubt
                } else {
                    Answer::Unknown
                };
                self.state = match appended {
                    Some(_) => State::Resolving {
                        payload,
                        term,
                        lsn,
                        asked: 0,
                    },
                    None => State::Idle { next_at: now },
                };
                (None, Some(self.answered(payload, term, lsn, answer, now)))
            }
            State::Resolving {
                payload,
                term,
                lsn,
                asked,
            } if now.saturating_sub(asked) >= times.retry => {
                self.rotate();
                self.state = State::Resolving {
                    payload,
                    term,
                    lsn,
                    asked: now,
                };
                (Some((self.target, Request::Resolve { term, lsn })), None)
            }
            _ => (None, None),
        }
    }

    fn answered(&self, payload: u64, term: Term, lsn: Lsn, answer: Answer, at: Time) -> Answered {
        Answered {
            client: self.id,
            payload,
            term,
            lsn,
            answer,
            at,
        }
    }

    /// A node's reply: an answer to record, if it is one.
    pub fn reply(&mut self, now: Time, reply: Reply) -> Option<Answered> {
        let (payload, term, lsn, answer) = match (&self.state, reply) {
            (State::Committing { payload, .. }, Reply::NotPrimary { payload: p })
                if *payload == p =>
            {
                self.rotate();
                self.state = State::Idle { next_at: now + 5 };
                return None;
            }
            (
                State::Committing { payload, sent, .. },
                Reply::Appended {
                    payload: p,
                    term,
                    lsn,
                },
            ) if *payload == p => {
                self.state = State::Committing {
                    payload: p,
                    sent: *sent,
                    appended: Some((term, lsn)),
                };
                return None;
            }
            (
                State::Committing { payload, .. },
                Reply::Ok {
                    payload: p,
                    term,
                    lsn,
                },
            ) if *payload == p => (p, term, lsn, Answer::Ok),
            (
                State::Committing { payload, .. },
                Reply::Unprotected {
                    payload: p,
                    term,
                    lsn,
                },
            ) if *payload == p => (p, term, lsn, Answer::Unprotected),
            (
                State::Committing { payload, .. },
                Reply::InDoubt {
                    payload: p,
                    term,
                    lsn,
                },
            ) if *payload == p => (p, term, lsn, Answer::InDoubt),
            (
                State::Resolving {
                    payload, term, lsn, ..
                },
                Reply::Resolved {
                    term: t,
                    lsn: l,
                    resolution,
                },
            ) if (*term, *lsn) == (t, l) => {
                let answer = if resolution == Resolution::Kept {
                    Answer::Kept
                } else {
                    Answer::Lost
                };
                (*payload, t, l, answer)
            }
            _ => return None,
        };
        self.state = match answer {
            Answer::Unprotected | Answer::InDoubt => {
                // The node that left it in doubt is not the one to ask: the next tick moves on.
                State::Resolving {
                    payload,
                    term,
                    lsn,
                    asked: 0,
                }
            }
            _ => State::Idle { next_at: now },
        };
        Some(self.answered(payload, term, lsn, answer, now))
    }
}
