//! The standby's door itself (issue 54, finding 3): the bytes a peer that has proved nothing
//! sends a standby's replication port, read as the door reads them, through the door's own
//! functions (`stela_server::replication::standby::{open_frame_len, whole_open}`): never more
//! than the `Open` the header announced, arriving in pieces of any size.
//!
//! Input: the first byte sets the size of the pieces the connection delivers (1 to 4096 bytes),
//! the rest is what the peer sends.
//!
//! Oracles:
//! - never panics; the door never holds more than a header and `MAX_OPEN_BYTES`, nor more than
//!   the frame its header announced (the rest stays in the socket);
//! - the pieces do not matter: the door ends with the one-shot decoding of the whole input
//!   (`frame::decode_from` under the same bound): the same `Open`, taking the same bytes, when
//!   that is an `Open`; "wait for more" only when the input is a frame's proper prefix; a refusal
//!   when the input is over the bound, damaged, or a message other than `Open`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stela_proto::frame::{self, FRAME_HEADER_BYTES};
use stela_proto::repl::ReplMessage;
use stela_server::replication::standby::{open_frame_len, whole_open, MAX_OPEN_BYTES};
use stela_server::replication::SessionEnd;

/// What the door made of the connection: the `Open` and its length, "wait", or a refusal.
type Outcome = Result<Option<(ReplMessage, usize)>, SessionEnd>;

/// Feeds `stream` to the door `piece` bytes at a time, as its reads would.
fn door(stream: &[u8], piece: usize) -> (Outcome, usize) {
    let mut held: Vec<u8> = Vec::new();
    let mut at = 0;
    loop {
        let want = match open_frame_len(&held) {
            Ok(want) => want,
            Err(refused) => return (Err(refused), held.len()),
        };
        assert!(want <= FRAME_HEADER_BYTES + MAX_OPEN_BYTES, "wants {want}");
        assert!(held.len() <= want, "read past the announced frame");
        if held.len() < want {
            if at == stream.len() {
                return (Ok(None), held.len());
            }
            let take = (want - held.len()).min(piece).min(stream.len() - at);
            held.extend_from_slice(&stream[at..at + take]);
            at += take;
        }
        match whole_open(&held) {
            Ok(None) => {
                // What the door wants now (the header may just have come whole).
                let now = open_frame_len(&held).expect("whole_open read this header");
                assert!(held.len() < now, "a whole frame still awaited");
            }
            decided => return (decided, held.len()),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&size, stream)) = data.split_first() else {
        return;
    };
    let piece = usize::from(size) * 16 + 1;
    let (outcome, held) = door(stream, piece);
    assert!(held <= FRAME_HEADER_BYTES + MAX_OPEN_BYTES);
    let once = frame::decode_from::<ReplMessage>(stream, MAX_OPEN_BYTES);
    match (&outcome, once) {
        (Ok(Some((open, used))), Ok(Some((message, len)))) => {
            assert!(matches!(open, ReplMessage::Open { .. }));
            assert_eq!((open, *used), (&message, len));
            assert_eq!(held, len);
        }
        (Ok(None), Ok(None)) => {}
        (Err(refused), Ok(Some((message, _)))) => {
            assert!(
                !matches!(message, ReplMessage::Open { .. }),
                "an Open the door refused: {refused}"
            );
            let _ = refused.to_string();
        }
        (Err(refused), Err(_)) => {
            assert_eq!(refused.kind(), "protocol", "{refused}");
        }
        (door, once) => panic!("the door says {door:?}, one read says {once:?}"),
    }
});
