//! A log's record schema: the field names of its record type, so that a dump can show compact
//! MessagePack records (structs as arrays, the default) with their field names, without every
//! record carrying them. It is kept once per log (`stela_wal::schema`, `SCHEMA.json`).
//!
//! The schema is traced from the Rust type itself (serde-reflection: the type's `Deserialize`
//! walked without a value) when a typed log is opened: by the embedded `stela_wal::Wal`, and by
//! the client library, which sends it to the daemon. A type that cannot be traced (it decides
//! its shape at run time: `deserialize_any`, untagged enums) gets no schema, and its records dump
//! as before.
//!
//! Invariant: the schema only ever renames: [`render`] turns an array into an object when, and
//! only when, the schema says that value is a struct with exactly that many fields; anything
//! that does not match is left as it is, so a wrong or stale schema can make a dump less
//! readable, never wrong or failing.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_reflection::{
    ContainerFormat, Format, Named, Registry, Samples, Tracer, TracerConfig, VariantFormat,
};

/// Tracing passes over a record type, and rounds of them (see [`Schema::of`]): enough for enums
/// of up to 64 variants nested 8 deep.
const TRACE_PASSES: usize = 64;
const TRACE_ROUNDS: usize = 8;

/// The shape of a log's records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schema {
    /// The record type's format (usually the name of a container in `registry`).
    pub root: Format,
    /// Every struct and enum the record type uses, by name.
    pub registry: Registry,
}

impl Schema {
    /// Traces `T`; `None` if its shape is decided at run time.
    pub fn of<T: DeserializeOwned>() -> Option<Schema> {
        // Each pass over `T` takes the next unseen variant of an enum it meets, provided the
        // enum is not marked as being explored (a mark that guards against recursion within a
        // pass): so the marks of the enums known to be incomplete are cleared before each pass.
        // The enums still incomplete at the end name themselves in the registry's error; a
        // fresh round then clears their marks too.
        let mut enums = std::collections::BTreeSet::<String>::new();
        for _ in 0..TRACE_ROUNDS {
            let mut tracer = Tracer::new(TracerConfig::default());
            let samples = Samples::new();
            let mut root = None;
            for _ in 0..TRACE_PASSES {
                for name in &enums {
                    tracer.check_incomplete_enum(name);
                }
                root = Some(tracer.trace_type_once::<T>(&samples).ok()?.0);
            }
            match tracer.registry() {
                Ok(registry) => {
                    return Some(Schema {
                        root: root?,
                        registry,
                    })
                }
                Err(serde_reflection::Error::MissingVariants(names)) => {
                    let known = enums.len();
                    enums.extend(names);
                    if enums.len() == known {
                        return None;
                    }
                }
                Err(_) => return None,
            }
        }
        None
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a schema serializes")
    }

    pub fn from_json(text: &str) -> Option<Schema> {
        serde_json::from_str(text).ok()
    }
}

/// `value` (a record decoded without its type) with the field names `schema` gives its structs.
pub fn render(value: Value, schema: &Schema) -> Value {
    render_format(value, &schema.root, &schema.registry, 0)
}

/// Deeper than this, values are left as they are (a recursive type cannot loop the renderer).
const MAX_DEPTH: usize = 64;

fn render_format(value: Value, format: &Format, registry: &Registry, depth: usize) -> Value {
    if depth > MAX_DEPTH {
        return value;
    }
    let next = depth + 1;
    match (format, value) {
        (Format::TypeName(name), value) => match registry.get(name) {
            Some(container) => render_container(value, container, registry, next),
            None => value,
        },
        (Format::Option(inner), value) if !value.is_null() => {
            render_format(value, inner, registry, next)
        }
        (Format::Seq(inner), Value::Array(items)) => Value::Array(
            items
                .into_iter()
                .map(|v| render_format(v, inner, registry, next))
                .collect(),
        ),
        (Format::TupleArray { content, .. }, Value::Array(items)) => Value::Array(
            items
                .into_iter()
                .map(|v| render_format(v, content, registry, next))
                .collect(),
        ),
        (Format::Tuple(formats), Value::Array(items)) if formats.len() == items.len() => {
            Value::Array(
                items
                    .into_iter()
                    .zip(formats)
                    .map(|(v, f)| render_format(v, f, registry, next))
                    .collect(),
            )
        }
        (Format::Map { value: inner, .. }, Value::Object(map)) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, render_format(v, inner, registry, next)))
                .collect(),
        ),
        (_, value) => value,
    }
}

fn render_container(
    value: Value,
    container: &ContainerFormat,
    registry: &Registry,
    depth: usize,
) -> Value {
    match container {
        ContainerFormat::Struct(fields) => render_fields(value, fields, registry, depth),
        ContainerFormat::NewTypeStruct(inner) => render_format(value, inner, registry, depth),
        ContainerFormat::TupleStruct(formats) => {
            render_format(value, &Format::Tuple(formats.clone()), registry, depth)
        }
        ContainerFormat::UnitStruct => value,
        // MessagePack writes a unit variant as its name, any other as {name: content}.
        ContainerFormat::Enum(variants) => match value {
            Value::Object(map) if map.len() == 1 => Value::Object(
                map.into_iter()
                    .map(|(name, content)| {
                        let variant = variants.values().find(|v| v.name == name);
                        let content = match variant.map(|v| &v.value) {
                            Some(VariantFormat::Struct(fields)) => {
                                render_fields(content, fields, registry, depth)
                            }
                            Some(VariantFormat::NewType(inner)) => {
                                render_format(content, inner, registry, depth)
                            }
                            Some(VariantFormat::Tuple(formats)) => render_format(
                                content,
                                &Format::Tuple(formats.clone()),
                                registry,
                                depth,
                            ),
                            _ => content,
                        };
                        (name, content)
                    })
                    .collect(),
            ),
            other => other,
        },
    }
}

/// A struct's array as an object with its field names (or a named one's fields rendered).
fn render_fields(
    value: Value,
    fields: &[Named<Format>],
    registry: &Registry,
    depth: usize,
) -> Value {
    match value {
        Value::Array(items) if items.len() == fields.len() => Value::Object(
            items
                .into_iter()
                .zip(fields)
                .map(|(v, f)| (f.name.clone(), render_format(v, &f.value, registry, depth)))
                .collect(),
        ),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| {
                    let rendered = match fields.iter().find(|f| f.name == k) {
                        Some(field) => render_format(v, &field.value, registry, depth),
                        None => v,
                    };
                    (k, rendered)
                })
                .collect(),
        ),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Codec;

    #[derive(Serialize, Deserialize)]
    enum Kind {
        Deposit,
        Withdraw { amount: i64, note: String },
        Fee(u32),
        Pair(u8, u8),
    }

    #[derive(Serialize, Deserialize)]
    struct Inner {
        a: u8,
        b: (u8, String),
    }

    #[derive(Serialize, Deserialize)]
    struct Entry {
        account: u32,
        kind: Kind,
        tags: Vec<String>,
        inner: Option<Inner>,
        nested: Vec<Inner>,
    }

    fn dumped(entry: &Entry, schema: &Schema) -> Value {
        let bytes = Codec::MessagePack.encode(entry).unwrap();
        render(Codec::MessagePack.to_json_value(&bytes).unwrap(), schema)
    }

    #[test]
    fn compact_records_dump_with_their_field_names() {
        let schema = Schema::of::<Entry>().expect("traceable");
        let schema = Schema::from_json(&schema.to_json()).expect("round trip");
        let entry = Entry {
            account: 7,
            kind: Kind::Withdraw {
                amount: -5,
                note: "rent".into(),
            },
            tags: vec!["t".into()],
            inner: Some(Inner {
                a: 1,
                b: (2, "s".into()),
            }),
            nested: vec![Inner {
                a: 3,
                b: (4, "u".into()),
            }],
        };
        assert_eq!(
            dumped(&entry, &schema),
            serde_json::json!({
                "account": 7,
                "kind": {"Withdraw": {"amount": -5, "note": "rent"}},
                "tags": ["t"],
                "inner": {"a": 1, "b": [2, "s"]},
                "nested": [{"a": 3, "b": [4, "u"]}],
            })
        );
        for (kind, shown) in [
            (Kind::Deposit, serde_json::json!("Deposit")),
            (Kind::Fee(3), serde_json::json!({"Fee": 3})),
            (Kind::Pair(1, 2), serde_json::json!({"Pair": [1, 2]})),
        ] {
            let entry = Entry {
                account: 1,
                kind,
                tags: vec![],
                inner: None,
                nested: vec![],
            };
            assert_eq!(dumped(&entry, &schema)["kind"], shown);
            assert_eq!(dumped(&entry, &schema)["inner"], Value::Null);
        }
    }

    #[test]
    fn a_schema_that_does_not_match_changes_nothing() {
        let schema = Schema::of::<Entry>().unwrap();
        for value in [
            serde_json::json!([1, 2]),
            serde_json::json!("text"),
            serde_json::json!({"x": [1, 2, 3]}),
            serde_json::json!(null),
        ] {
            assert_eq!(render(value.clone(), &schema), value);
        }
    }

    #[test]
    fn a_type_decided_at_run_time_has_no_schema() {
        assert!(Schema::of::<serde_json::Value>().is_none());
    }
}
