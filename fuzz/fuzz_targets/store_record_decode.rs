//! Arbitrary bytes as a stela-store log record payload.
//!
//! Oracles:
//! - never panics: every payload that does not decode, or decodes to a record the store could
//!   not have written, is an `Err` (restart refuses it instead of acting on it);
//! - a record that decodes re-encodes to a payload that decodes to the same record.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stela_store::LogRecord;

fuzz_target!(|payload: &[u8]| {
    if let Ok(record) = LogRecord::decode(payload) {
        assert_eq!(
            LogRecord::decode(&record.encode()).expect("re-decodes"),
            record
        );
    }
});
