//! Arbitrary bytes as a stela-store page image, decoded as page 7.
//!
//! Oracles:
//! - never panics: every malformed image is an `Err`;
//! - an image that decodes is canonical: encoding the page as page 7 gives back the same bytes
//!   (an all-zero image, the never-written page, decodes as an empty leaf at LSN 0 and is the
//!   one exception: its encoding carries a checksum and the page id).
#![no_main]

use libfuzzer_sys::fuzz_target;
use stela_store::format::page::{self, PAGE_SIZE};

fuzz_target!(|bytes: &[u8]| {
    // Most inputs are short: pad them to a page so the decoder gets past the size check.
    let mut image = bytes.to_vec();
    if image.len() < PAGE_SIZE {
        image.resize(PAGE_SIZE, 0);
    }
    let Ok(page) = page::decode(7, &image) else {
        return;
    };
    let encoded = page::encode(7, &page).expect("a decoded page encodes");
    if image.iter().any(|&b| b != 0) {
        assert_eq!(
            &encoded[..],
            &image[..],
            "decode then encode is not the identity"
        );
    }
    assert_eq!(page::decode(7, &encoded[..]).expect("re-decodes"), page);
});
