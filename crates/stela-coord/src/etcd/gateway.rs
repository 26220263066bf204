//! etcd's JSON gateway, the four calls the coordinator makes: read a key, grant a lease, and a
//! transaction of compares and puts. Each is one HTTP/1.1 POST of JSON to `/v3/...` on etcd's
//! client port and one JSON answer; keys and values travel as base64, 64-bit integers as JSON
//! strings (protobuf's JSON mapping), and fields at their zero value are left out of answers.
//!
//! Invariants:
//! - every call is bounded: one deadline covers connect, send and the whole answer, and an
//!   answer is read up to [`MAX_ANSWER`] bytes only (etcd is a peer, not a trusted input);
//! - no proxy and no redirect: the coordinator talks to the endpoint it was given, or to none.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize};
use std::time::Duration;

/// The most an answer may hold: a range of one small key, a lease or a transaction's result.
const MAX_ANSWER: u64 = 1 << 20;

/// Why a gateway call failed.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("{0}")]
    Transport(#[from] ureq::Error),
    #[error("HTTP {status} from {path}: {message}")]
    Refused {
        path: &'static str,
        status: u16,
        message: String,
    },
    #[error("an answer from {path} that is not etcd's JSON: {source}")]
    Malformed {
        path: &'static str,
        source: serde_json::Error,
    },
    #[error("the endpoint is not http://HOST:PORT")]
    BadEndpoint,
}

/// An etcd client endpoint, with a pooled keep-alive connection.
pub struct Gateway {
    endpoint: String,
    agent: ureq::Agent,
}

/// One comparison of a transaction: `key` is as it was at `revision` (0: absent).
pub struct Compare<'a> {
    key: &'a str,
    revision: i64,
}

impl<'a> Compare<'a> {
    pub fn unchanged(key: &'a str, revision: i64) -> Self {
        Compare { key, revision }
    }
}

/// One put of a transaction; `lease` 0 attaches none.
pub struct Put<'a> {
    pub key: &'a str,
    pub value: Vec<u8>,
    pub lease: i64,
}

impl Gateway {
    /// # Errors
    /// `endpoint` is not an `http://HOST:PORT` URL.
    pub fn new(endpoint: &str, timeout: Duration) -> Result<Gateway, GatewayError> {
        let host_port = endpoint
            .strip_prefix("http://")
            .ok_or(GatewayError::BadEndpoint)?;
        if host_port.is_empty() || host_port.contains('/') {
            return Err(GatewayError::BadEndpoint);
        }
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .proxy(None)
            .max_redirects(0)
            .build();
        Ok(Gateway {
            endpoint: endpoint.to_owned(),
            agent: ureq::Agent::new_with_config(config),
        })
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// `key`'s value and mod revision, or `None` if it is absent.
    pub fn get(&self, key: &str) -> Result<Option<(Vec<u8>, i64)>, GatewayError> {
        #[derive(Deserialize)]
        struct Range {
            #[serde(default)]
            kvs: Vec<KeyValue>,
        }
        #[derive(Deserialize)]
        struct KeyValue {
            #[serde(default, deserialize_with = "int64")]
            mod_revision: i64,
            #[serde(default)]
            value: String,
        }
        let range: Range = self.call("/v3/kv/range", &serde_json::json!({ "key": b64(key) }))?;
        let Some(kv) = range.kvs.into_iter().next() else {
            return Ok(None);
        };
        // A value etcd stored is base64 of bytes; one that is not decodes as empty, which no
        // caller takes for a claim.
        let value = BASE64.decode(kv.value).unwrap_or_default();
        Ok(Some((value, kv.mod_revision)))
    }

    /// A new etcd lease of `ttl_seconds`; its id.
    pub fn lease_grant(&self, ttl_seconds: i64) -> Result<i64, GatewayError> {
        #[derive(Deserialize)]
        struct Granted {
            #[serde(rename = "ID", deserialize_with = "int64")]
            id: i64,
        }
        let granted: Granted = self.call(
            "/v3/lease/grant",
            &serde_json::json!({ "TTL": ttl_seconds }),
        )?;
        Ok(granted.id)
    }

    /// Applies `puts` if every comparison holds; whether it did.
    pub fn txn(&self, compares: &[Compare<'_>], puts: &[Put<'_>]) -> Result<bool, GatewayError> {
        #[derive(Deserialize)]
        struct Outcome {
            #[serde(default)]
            succeeded: bool,
        }
        let compare: Vec<_> = compares.iter().map(compare_json).collect();
        let success: Vec<_> = puts.iter().map(put_json).collect();
        let request = serde_json::json!({ "compare": compare, "success": success });
        let outcome: Outcome = self.call("/v3/kv/txn", &request)?;
        Ok(outcome.succeeded)
    }

    fn call<T: for<'de> Deserialize<'de>>(
        &self,
        path: &'static str,
        request: &impl Serialize,
    ) -> Result<T, GatewayError> {
        let body = serde_json::to_vec(request)
            .map_err(|source| GatewayError::Malformed { path, source })?;
        let mut answer = self
            .agent
            .post(format!("{}{path}", self.endpoint))
            .content_type("application/json")
            .send(&body[..])?;
        let status = answer.status().as_u16();
        let bytes = answer
            .body_mut()
            .with_config()
            .limit(MAX_ANSWER)
            .read_to_vec()?;
        if status != 200 {
            return Err(GatewayError::Refused {
                path,
                status,
                message: refusal_message(&bytes),
            });
        }
        serde_json::from_slice(&bytes).map_err(|source| GatewayError::Malformed { path, source })
    }
}

fn b64(key: &str) -> String {
    BASE64.encode(key)
}

/// A comparison in the gateway's form: the mod revision equal to `revision`, or for an absent
/// key (revision 0) its version equal to 0 (the mod revision of an absent key is not 0 to etcd's
/// comparison: it fails).
fn compare_json(compare: &Compare<'_>) -> serde_json::Value {
    let key = b64(compare.key);
    if compare.revision == 0 {
        serde_json::json!({ "key": key, "result": "EQUAL", "target": "VERSION", "version": "0" })
    } else {
        let revision = compare.revision.to_string();
        serde_json::json!({ "key": key, "result": "EQUAL", "target": "MOD", "mod_revision": revision })
    }
}

fn put_json(put: &Put<'_>) -> serde_json::Value {
    let mut request =
        serde_json::json!({ "key": b64(put.key), "value": BASE64.encode(&put.value) });
    if put.lease != 0 {
        request["lease"] = put.lease.to_string().into();
    }
    serde_json::json!({ "request_put": request })
}

/// The message of an error answer (`{"error": ..., "message": ..., "code": ...}`), or its first
/// bytes if it is not one.
fn refusal_message(bytes: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Refusal {
        #[serde(default)]
        message: String,
        #[serde(default)]
        error: String,
    }
    match serde_json::from_slice::<Refusal>(bytes) {
        Ok(r) if !r.message.is_empty() => r.message,
        Ok(r) if !r.error.is_empty() => r.error,
        _ => String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned(),
    }
}

/// A protobuf int64 in JSON: a string of digits (as etcd writes it) or a number.
fn int64<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Int64 {
        Text(String),
        Number(i64),
    }
    match Int64::deserialize(deserializer)? {
        Int64::Number(n) => Ok(n),
        Int64::Text(text) => text.parse().map_err(serde::de::Error::custom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int64_reads_etcd_strings_and_numbers() {
        #[derive(Deserialize)]
        struct R {
            #[serde(deserialize_with = "int64")]
            n: i64,
        }
        let parse = |s: &str| serde_json::from_str::<R>(s).map(|r| r.n);
        assert_eq!(
            parse(r#"{"n":"7587884218457283584"}"#).unwrap(),
            7_587_884_218_457_283_584
        );
        assert_eq!(parse(r#"{"n":12}"#).unwrap(), 12);
        assert!(parse(r#"{"n":"twelve"}"#).is_err());
    }

    #[test]
    fn an_absent_key_is_compared_by_version_a_present_one_by_mod_revision() {
        let absent = compare_json(&Compare::unchanged("/k", 0));
        assert_eq!(absent["target"], "VERSION");
        assert_eq!(absent["version"], "0");
        let present = compare_json(&Compare::unchanged("/k", 42));
        assert_eq!(present["target"], "MOD");
        assert_eq!(present["mod_revision"], "42");
        assert_eq!(present["key"], BASE64.encode("/k"));
    }

    #[test]
    fn a_put_names_its_lease_only_when_it_has_one() {
        let plain = put_json(&Put {
            key: "/k",
            value: b"v".to_vec(),
            lease: 0,
        });
        assert!(plain["request_put"].get("lease").is_none());
        let leased = put_json(&Put {
            key: "/k",
            value: b"v".to_vec(),
            lease: 9,
        });
        assert_eq!(leased["request_put"]["lease"], "9");
    }

    #[test]
    fn endpoints_other_than_http_host_port_are_refused() {
        let t = Duration::from_millis(10);
        assert!(Gateway::new("http://127.0.0.1:2379", t).is_ok());
        for bad in ["127.0.0.1:2379", "https://h:1", "http://", "http://h:1/v3"] {
            assert!(
                matches!(Gateway::new(bad, t), Err(GatewayError::BadEndpoint)),
                "{bad}"
            );
        }
    }
}
