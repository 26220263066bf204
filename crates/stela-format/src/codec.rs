//! Record codecs: how a typed record becomes the payload of a frame.
//!
//! The codec is chosen when a log is created and recorded in every segment header, so a log is
//! always read with the codec it was written with. Each codec only turns values into bytes; the
//! frame around the payload carries the CRC32C, so a JSON log is as well protected against a
//! changed digit as a binary one (plain JSON accepts a flipped value that still parses).
//!
//! - `Json` (serde_json): human readable, the largest and slowest; `stela wal dump` shows it as is.
//! - `MessagePack` (rmp-serde, structs as arrays): compact and self-describing, so the tools can
//!   still show any record as JSON without knowing its Rust type.
//! - `Postcard` (postcard, varint integers): the most compact, not self-describing; the tools
//!   show its payloads as hex.

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt;

/// The codec a log is written with. The discriminant is the byte stored in segment headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Codec {
    Json = 1,
    MessagePack = 2,
    Postcard = 3,
}

/// A value that could not be encoded or decoded by a codec.
#[derive(Debug, thiserror::Error)]
#[error("{codec} codec: {message}")]
pub struct CodecError {
    pub codec: Codec,
    pub message: String,
}

impl Codec {
    pub const ALL: [Codec; 3] = [Codec::Json, Codec::MessagePack, Codec::Postcard];

    /// The byte that names this codec in a segment header.
    pub fn id(self) -> u8 {
        self as u8
    }

    pub fn from_id(id: u8) -> Option<Codec> {
        Codec::ALL.into_iter().find(|codec| codec.id() == id)
    }

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Json => "json",
            Codec::MessagePack => "msgpack",
            Codec::Postcard => "postcard",
        }
    }

    /// Parses a codec name; accepts the aliases people type.
    pub fn from_name(name: &str) -> Option<Codec> {
        match name.to_ascii_lowercase().as_str() {
            "json" => Some(Codec::Json),
            "msgpack" | "messagepack" | "mp" | "rmp" => Some(Codec::MessagePack),
            "postcard" | "binary" | "compact" => Some(Codec::Postcard),
            _ => None,
        }
    }

    /// Whether payloads can be shown without the Rust type (JSON and MessagePack can).
    pub fn is_self_describing(self) -> bool {
        !matches!(self, Codec::Postcard)
    }

    /// Encodes `value`, appending the bytes to `out`.
    pub fn encode_into<T: Serialize + ?Sized>(
        self,
        value: &T,
        out: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        let result = match self {
            Codec::Json => serde_json::to_writer(&mut *out, value).map_err(|e| e.to_string()),
            Codec::MessagePack => {
                rmp_serde::encode::write(&mut *out, value).map_err(|e| e.to_string())
            }
            Codec::Postcard => postcard::to_io(value, &mut *out)
                .map(|_| ())
                .map_err(|e| e.to_string()),
        };
        result.map_err(|message| CodecError {
            codec: self,
            message,
        })
    }

    /// [`Codec::encode_into`], with MessagePack structs written as maps of their field names
    /// when `field_names` is set (other codecs: unchanged). Such records dump with their names;
    /// they cost the names' bytes (the paper's ~113-byte record becomes ~170). Decoding takes
    /// either form, so a log may hold both.
    pub fn encode_into_named<T: Serialize + ?Sized>(
        self,
        value: &T,
        out: &mut Vec<u8>,
        field_names: bool,
    ) -> Result<(), CodecError> {
        if !(field_names && self == Codec::MessagePack) {
            return self.encode_into(value, out);
        }
        rmp_serde::encode::write_named(&mut *out, value).map_err(|e| CodecError {
            codec: self,
            message: e.to_string(),
        })
    }

    /// Encodes `value` into a new buffer.
    pub fn encode<T: Serialize + ?Sized>(self, value: &T) -> Result<Vec<u8>, CodecError> {
        let mut out = Vec::new();
        self.encode_into(value, &mut out)?;
        Ok(out)
    }

    /// Decodes one whole payload. Bytes left over after the value are an error: a payload is
    /// exactly one record, and leftovers mean the record type does not match the bytes.
    pub fn decode<T: DeserializeOwned>(self, payload: &[u8]) -> Result<T, CodecError> {
        let result = match self {
            Codec::Json => serde_json::from_slice(payload).map_err(|e| e.to_string()),
            Codec::MessagePack => return decode_msgpack(payload),
            Codec::Postcard => match postcard::take_from_bytes(payload) {
                Ok((value, [])) => Ok(value),
                Ok((_, rest)) => Err(format!(
                    "{} bytes left after the record (payload is {} bytes)",
                    rest.len(),
                    payload.len()
                )),
                Err(e) => Err(e.to_string()),
            },
        };
        result.map_err(|message| CodecError {
            codec: self,
            message,
        })
    }

    /// Renders a payload as JSON without knowing its Rust type, for dump tools. Postcard is not
    /// self-describing, so its payloads come back as `{"hex": "..."}`.
    pub fn to_json_value(self, payload: &[u8]) -> Result<serde_json::Value, CodecError> {
        match self {
            Codec::Json => self.decode::<serde_json::Value>(payload),
            Codec::MessagePack => self.decode::<AnyJson>(payload).map(|json| json.0),
            Codec::Postcard => {
                let hex: String = payload.iter().map(|b| format!("{b:02x}")).collect();
                Ok(serde_json::json!({ "hex": hex }))
            }
        }
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A JSON value read from a self-describing payload of any shape. MessagePack has byte
/// strings, which JSON lacks (`serde_json::Value` refuses them): they become `{"utf8": "..."}`
/// when they are UTF-8 (a file's path), else `{"hex": "..."}` as Postcard payloads do; map keys
/// that are not strings are written as JSON text.
struct AnyJson(serde_json::Value);

impl<'de> serde::Deserialize<'de> for AnyJson {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(AnyJsonVisitor).map(AnyJson)
    }
}

struct AnyJsonVisitor;

impl<'de> serde::de::Visitor<'de> for AnyJsonVisitor {
    type Value = serde_json::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any self-describing value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_bytes<E>(self, v: &[u8]) -> Result<Self::Value, E> {
        if let Ok(text) = std::str::from_utf8(v) {
            return Ok(serde_json::json!({ "utf8": text }));
        }
        let hex: String = v.iter().map(|b| format!("{b:02x}")).collect();
        Ok(serde_json::json!({ "hex": hex }))
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_newtype_struct<D: serde::Deserializer<'de>>(
        self,
        d: D,
    ) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(AnyJson(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(serde_json::Value::Array(items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some((AnyJson(key), AnyJson(value))) = map.next_entry()? {
            let key = match key {
                serde_json::Value::String(key) => key,
                other => other.to_string(),
            };
            object.insert(key, value);
        }
        Ok(serde_json::Value::Object(object))
    }
}

/// MessagePack through the borrowing slice reader (strings are read in place, not copied
/// through a scratch buffer first). That reader does not say where the value ended, so the check
/// for leftover bytes asks for one more value: running out of input is the only good outcome.
fn decode_msgpack<T: DeserializeOwned>(payload: &[u8]) -> Result<T, CodecError> {
    use rmp_serde::decode::Error as RmpError;
    use serde::de::{Deserialize, IgnoredAny};
    let mut deserializer = rmp_serde::Deserializer::from_read_ref(payload);
    let failed = |message: String| CodecError {
        codec: Codec::MessagePack,
        message,
    };
    let value = T::deserialize(&mut deserializer).map_err(|e| failed(e.to_string()))?;
    match IgnoredAny::deserialize(&mut deserializer) {
        Err(RmpError::InvalidMarkerRead(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Ok(value)
        }
        _ => Err(failed(format!(
            "bytes left after the record (payload is {} bytes)",
            payload.len()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    /// A record with a byte string (serde_bytes' form), as `stela run`'s records have.
    struct WithBytes;

    impl Serialize for WithBytes {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeStruct;
            let mut record = s.serialize_struct("Write", 3)?;
            record.serialize_field("offset", &7u64)?;
            record.serialize_field("path", &Bytes(b"/d/a"))?;
            record.serialize_field("data", &Bytes(b"\xffhi"))?;
            record.end()
        }
    }

    struct Bytes(&'static [u8]);

    impl Serialize for Bytes {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(self.0)
        }
    }

    #[test]
    fn a_messagepack_byte_string_is_dumped_as_text_or_hex() {
        let payload = Codec::MessagePack.encode(&WithBytes).unwrap();
        let json = Codec::MessagePack.to_json_value(&payload).unwrap();
        let expected = serde_json::json!([7, { "utf8": "/d/a" }, { "hex": "ff6869" }]);
        assert_eq!(json, expected);
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Withdrawal {
        account: u32,
        amount: i64,
        memo: String,
    }

    #[test]
    fn msgpack_with_field_names_dumps_them_and_both_forms_decode() {
        let record = Withdrawal {
            account: 2,
            amount: -5,
            memo: "withdraw".into(),
        };
        let mut named = Vec::new();
        Codec::MessagePack
            .encode_into_named(&record, &mut named, true)
            .unwrap();
        assert_eq!(
            Codec::MessagePack.to_json_value(&named).unwrap(),
            serde_json::json!({"account": 2, "amount": -5, "memo": "withdraw"})
        );
        let compact = Codec::MessagePack.encode(&record).unwrap();
        assert_eq!(
            Codec::MessagePack.to_json_value(&compact).unwrap(),
            serde_json::json!([2, -5, "withdraw"])
        );
        assert!(compact.len() < named.len());
        for bytes in [&named, &compact] {
            assert_eq!(
                Codec::MessagePack.decode::<Withdrawal>(bytes).unwrap(),
                record
            );
        }
        // Other codecs are unchanged by the flag.
        let mut json = Vec::new();
        Codec::Json
            .encode_into_named(&record, &mut json, true)
            .unwrap();
        assert_eq!(json, Codec::Json.encode(&record).unwrap());
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Data {
        a: u32,
        b: u32,
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Record {
        id: u32,
        comment: String,
        objects: Vec<Data>,
    }

    #[test]
    fn every_codec_round_trips_the_papers_record() {
        let record = Record {
            id: 7,
            comment: "transfer".into(),
            objects: vec![Data { a: 1, b: 2 }, Data { a: 3, b: 4 }],
        };
        for codec in Codec::ALL {
            let bytes = codec.encode(&record).unwrap();
            assert_eq!(codec.decode::<Record>(&bytes).unwrap(), record, "{codec}");
            assert_eq!(Codec::from_id(codec.id()), Some(codec));
            assert_eq!(Codec::from_name(codec.name()), Some(codec));
        }
    }

    #[test]
    fn a_payload_of_another_type_is_an_error_not_a_value() {
        let bytes = Codec::MessagePack.encode(&(1u32, 2u32, 3u32)).unwrap();
        let err = Codec::MessagePack.decode::<Record>(&bytes).unwrap_err();
        assert_eq!(err.codec, Codec::MessagePack);
        let bytes = Codec::Postcard.encode(&(1u32, 2u32, 3u32)).unwrap();
        assert!(Codec::Postcard.decode::<u32>(&bytes).is_err());
    }

    #[test]
    fn bytes_left_after_the_record_are_an_error_in_every_codec() {
        for codec in Codec::ALL {
            // Self-delimiting values (JSON would read the digits of `7` then `8` as `78`).
            let mut bytes = codec.encode(&(7u32, "x")).unwrap();
            bytes.extend(codec.encode(&(8u32, "y")).unwrap());
            let err = codec.decode::<(u32, String)>(&bytes).unwrap_err();
            let message = err.to_string();
            assert!(
                message.contains("left after") || message.contains("trailing"),
                "{codec}: {message}"
            );
            // A truncated value is an error too, not a default.
            let whole = codec.encode(&"some text").unwrap();
            assert!(
                codec.decode::<String>(&whole[..whole.len() - 1]).is_err(),
                "{codec}"
            );
        }
    }

    #[test]
    fn msgpack_payloads_render_as_json() {
        let bytes = Codec::MessagePack.encode(&("a", 1u8)).unwrap();
        let value = Codec::MessagePack.to_json_value(&bytes).unwrap();
        assert_eq!(value, serde_json::json!(["a", 1]));
    }
}
