//! Typed columns a table declares (`[[table.column]]` in its policy file): a name, a type and
//! where the value comes from in a record's body (a JSON pointer). Appends are checked against
//! them; Parquet segments carry them beside `body` (which stays, so nothing is lost and a
//! round trip stays exact), with statistics that readers prune files and row groups by.
//!
//! A value that does not match its column is refused at append (the default), or, for a column
//! declared with `on_mismatch = "null"`, stored as null and counted. Archival never refuses:
//! rows appended before a column was declared, or under `"null"`, are archived with a null.

use serde::{Deserialize, Serialize};

use super::{EVENT_TIME_MAX, EVENT_TIME_MIN, Micros, Record};
use crate::error::{Error, Result};

/// Columns a table may declare.
pub const COLUMNS_MAX: usize = 64;
/// Longest column name, in bytes.
pub const COLUMN_NAME_BYTES_MAX: usize = 64;
/// Longest `from` pointer, in bytes.
pub const COLUMN_POINTER_BYTES_MAX: usize = 256;
/// Names frostline's segments and Delta tables already use.
pub const RESERVED_COLUMN_NAMES: [&str; 9] =
    ["partition_key", "event_time", "sort_key", "tenant", "kind", "body", "installation", "bucket", "partition"];

/// The type of a declared column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ColumnType {
    /// A JSON string.
    String,
    /// A JSON number without a fraction, within a signed 64-bit integer.
    Int64,
    /// Any JSON number.
    Float64,
    /// `true` or `false`.
    Bool,
    /// A JSON string in RFC 3339 (`2013-01-01T05:15:00Z`), kept to the microsecond, UTC.
    Timestamp,
}

impl ColumnType {
    pub fn name(self) -> &'static str {
        match self {
            ColumnType::String => "string",
            ColumnType::Int64 => "int64",
            ColumnType::Float64 => "float64",
            ColumnType::Bool => "bool",
            ColumnType::Timestamp => "timestamp",
        }
    }

    /// What a body must hold for a value of this type, in words.
    fn expects(self) -> &'static str {
        match self {
            ColumnType::String => "a string",
            ColumnType::Int64 => "an integer within 64 bits",
            ColumnType::Float64 => "a number",
            ColumnType::Bool => "true or false",
            ColumnType::Timestamp => "an RFC 3339 time string (2013-01-01T05:15:00Z)",
        }
    }
}

/// What an append does with a value that does not match its column.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnMismatch {
    /// The batch is refused, naming the record, the column and what it expected.
    #[default]
    Refuse,
    /// The column is null for that record, and the miss is counted (`AppendOutcome`). Only for
    /// nullable columns.
    Null,
}

/// One declared column.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnSpec {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: ColumnType,
    /// A JSON pointer (RFC 6901) into the body: `/carrier`, `/flight/number`; `""` is the body.
    pub from: String,
    /// Whether a record may lack the value (or hold `null`).
    pub nullable: bool,
    pub on_mismatch: OnMismatch,
}

#[cfg(test)]
impl ColumnSpec {
    /// A nullable column read from the body's field of its name, refusing what does not fit:
    /// the tests' usual column.
    pub(crate) fn nullable(name: &str, kind: ColumnType) -> ColumnSpec {
        ColumnSpec {
            name: name.into(),
            kind,
            from: format!("/{name}"),
            nullable: true,
            on_mismatch: OnMismatch::Refuse,
        }
    }
}

/// A column's value in one record.
#[derive(Debug, Clone, PartialEq)]
pub enum ColumnValue {
    Null,
    String(String),
    Int64(i64),
    Float64(f64),
    Bool(bool),
    Timestamp(Micros),
}

/// Why a body's value does not fit its column, in words ("a string \"12.5\"").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch(pub String);

/// A record's body read as far as its columns need it: its top-level fields, each left as raw
/// JSON text until a column asks for it. Parsing every body whole into values (keys and nested
/// objects allocated) cost the archive pass with five columns a quarter of its rate; this
/// keeps one small allocation per record.
pub struct Body<'a> {
    text: &'a str,
    /// The fields of an object body, in order (a repeated key's last value counts, as in
    /// `serde_json::Value`); `None` for any other body.
    fields: Option<Fields<'a>>,
}

type RawValue = serde_json::value::RawValue;

/// An object's fields, as raw values.
struct Fields<'a>(Vec<(Text<'a>, &'a RawValue)>);

/// A JSON string (a field's name, or a value), borrowed from the body unless it holds an
/// escape. serde's own `Cow<str>` always copies, which cost a copy of every key of every body
/// a pass encodes.
struct Text<'a>(std::borrow::Cow<'a, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> std::result::Result<Text<'de>, E> {
                Ok(Text(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<Text<'de>, E> {
                Ok(Text(std::borrow::Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> std::result::Result<Text<'de>, E> {
                Ok(Text(std::borrow::Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(Visit)
    }
}

impl<'de> Deserialize<'de> for Fields<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> std::result::Result<Fields<'de>, A::Error> {
                let mut fields = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some((key, value)) = map.next_entry::<Text<'de>, &'de RawValue>()? {
                    fields.push((key, value));
                }
                Ok(Fields(fields))
            }
        }
        deserializer.deserialize_map(Visit)
    }
}

impl<'a> Fields<'a> {
    fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.0.iter().rev().find(|(k, _)| k.0 == key).map(|(_, v)| *v)
    }
}

impl<'a> Body<'a> {
    /// Reads `text` once: an object's fields, or (any other body) only that it is JSON.
    pub fn parse(text: &'a str) -> serde_json::Result<Body<'a>> {
        if text.trim_start().starts_with('{') {
            return Ok(Body { text, fields: Some(serde_json::from_str(text)?) });
        }
        serde_json::from_str::<&RawValue>(text)?;
        Ok(Body { text, fields: None })
    }

    /// The raw value at a JSON pointer (RFC 6901, as `serde_json::Value::pointer` reads it).
    fn at(&self, pointer: &str) -> Option<&'a RawValue> {
        if pointer.is_empty() {
            return serde_json::from_str(self.text.trim()).ok();
        }
        // Unescaped only where a token has an escape: most have none, and every row asks.
        let mut tokens = pointer.strip_prefix('/')?.split('/').map(|t| match t.contains('~') {
            true => std::borrow::Cow::Owned(t.replace("~1", "/").replace("~0", "~")),
            false => std::borrow::Cow::Borrowed(t),
        });
        let mut value = self.fields.as_ref()?.get(&tokens.next()?)?;
        for token in tokens {
            value = match value.get().as_bytes().first() {
                Some(b'{') => serde_json::from_str::<Fields>(value.get()).ok()?.get(&token)?,
                Some(b'[') => {
                    // An index as serde_json reads one: digits, no sign, no leading zero.
                    if token.starts_with('+') || (token.len() > 1 && token.starts_with('0')) {
                        return None;
                    }
                    let index: usize = token.parse().ok()?;
                    *serde_json::from_str::<Vec<&RawValue>>(value.get()).ok()?.get(index)?
                }
                _ => return None,
            };
        }
        Some(value)
    }
}

impl ColumnSpec {
    /// The column's value in `body`.
    pub fn extract(&self, body: &Body) -> std::result::Result<ColumnValue, Mismatch> {
        let raw = match body.at(&self.from) {
            Some(raw) if raw.get() != "null" => raw.get(),
            _ if self.nullable => return Ok(ColumnValue::Null),
            None => return Err(Mismatch("nothing there".into())),
            Some(_) => return Err(Mismatch("null".into())),
        };
        let found = || {
            Mismatch(
                serde_json::from_str::<serde_json::Value>(raw).map_or_else(|_| format!("`{raw}`"), |v| describe(&v)),
            )
        };
        let mut json = serde_json::Deserializer::from_str(raw);
        match serde::de::DeserializeSeed::deserialize(Convert(self.kind), &mut json).and_then(|v| json.end().map(|_| v))
        {
            Ok(Some(value)) => Ok(value),
            _ => Err(found()),
        }
    }

    /// The column's value in `body`, null where it does not fit: what archival writes.
    pub fn extract_or_null(&self, body: &Body) -> ColumnValue {
        self.extract(body).unwrap_or(ColumnValue::Null)
    }

    /// The column in words, for errors and the manifest's schema.
    pub fn describe(&self) -> String {
        format!(
            "{} {}{} from `{}`",
            self.name,
            self.kind.name(),
            if self.nullable { " (nullable)" } else { "" },
            self.from
        )
    }
}

/// Turns one JSON value into a column's value: `Some` when it fits the column's type (`null`
/// is `ColumnValue::Null`), `None` when it does not. The one conversion both `extract` and the
/// one-scan `Extractor` use, so they cannot disagree.
struct Convert(ColumnType);

impl<'de> serde::de::DeserializeSeed<'de> for Convert {
    type Value = Option<ColumnValue>;
    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> std::result::Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Convert {
    type Value = Option<ColumnValue>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> std::result::Result<Self::Value, E> {
        Ok(Some(ColumnValue::Null))
    }
    fn visit_bool<E>(self, v: bool) -> std::result::Result<Self::Value, E> {
        Ok((self.0 == ColumnType::Bool).then_some(ColumnValue::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> std::result::Result<Self::Value, E> {
        Ok(match self.0 {
            ColumnType::Int64 => Some(ColumnValue::Int64(v)),
            ColumnType::Float64 => Some(ColumnValue::Float64(v as f64)),
            _ => None,
        })
    }
    fn visit_u64<E>(self, v: u64) -> std::result::Result<Self::Value, E> {
        Ok(match self.0 {
            ColumnType::Int64 => i64::try_from(v).ok().map(ColumnValue::Int64),
            ColumnType::Float64 => Some(ColumnValue::Float64(v as f64)),
            _ => None,
        })
    }
    fn visit_f64<E>(self, v: f64) -> std::result::Result<Self::Value, E> {
        Ok((self.0 == ColumnType::Float64).then_some(ColumnValue::Float64(v)))
    }
    fn visit_str<E>(self, v: &str) -> std::result::Result<Self::Value, E> {
        Ok(match self.0 {
            ColumnType::String => Some(ColumnValue::String(v.to_owned())),
            ColumnType::Timestamp => super::time::parse_rfc3339(v)
                .ok()
                .filter(|t| (EVENT_TIME_MIN..=EVENT_TIME_MAX).contains(t))
                .map(ColumnValue::Timestamp),
            _ => None,
        })
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Self::Value, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> std::result::Result<Self::Value, A::Error> {
        while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
        Ok(None)
    }
}

/// Takes a table's typed columns out of bodies as archival writes them (`extract_or_null` of
/// each column). Where every column reads a distinct top-level field (`/carrier`), one scan
/// of the body converts each value as it passes and skips the other fields; any other table,
/// and any body that scan cannot read, takes the general path (`Body` and `at`). Measured on
/// flights-like bodies of seven fields and five columns: the general path's cost of parsing
/// the fields and then each value again halves.
pub struct Extractor<'c> {
    columns: &'c [ColumnSpec],
    /// Each column's top-level field name, where every column has a distinct one.
    fields: Option<Vec<String>>,
}

impl<'c> Extractor<'c> {
    pub fn new(columns: &'c [ColumnSpec]) -> Extractor<'c> {
        let names: Option<Vec<String>> = columns
            .iter()
            .map(|c| c.from.strip_prefix('/').filter(|t| !t.contains(['/', '~'])).map(str::to_string))
            .collect();
        let distinct =
            |names: &Vec<String>| names.iter().collect::<std::collections::BTreeSet<_>>().len() == names.len();
        Extractor { columns, fields: names.filter(distinct) }
    }

    /// The columns' values in `body`, in declaration order, each null where it does not fit.
    pub fn values(&self, body: &str, out: &mut Vec<ColumnValue>) {
        out.clear();
        out.resize(self.columns.len(), ColumnValue::Null);
        if let Some(fields) = &self.fields
            && body.trim_start().starts_with('{')
        {
            let mut json = serde_json::Deserializer::from_str(body);
            let scan = Scan { fields, kinds: self.columns, out };
            if serde::Deserializer::deserialize_map(&mut json, scan).and_then(|()| json.end()).is_ok() {
                return;
            }
            out.iter_mut().for_each(|v| *v = ColumnValue::Null);
        }
        // A body that is not JSON was refused at append; should one come, its columns are null.
        if let Ok(parsed) = Body::parse(body) {
            for (column, value) in self.columns.iter().zip(out.iter_mut()) {
                *value = column.extract_or_null(&parsed);
            }
        }
    }
}

/// One scan of an object body for `Extractor`: a wanted field's value is converted, any other
/// skipped; a repeated field's last value counts, as in `serde_json::Value`.
struct Scan<'s> {
    fields: &'s [String],
    kinds: &'s [ColumnSpec],
    out: &'s mut [ColumnValue],
}

impl<'de> serde::de::Visitor<'de> for Scan<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> std::result::Result<(), A::Error> {
        while let Some(key) = map.next_key::<Text<'de>>()? {
            match self.fields.iter().position(|f| *f == key.0) {
                Some(i) => {
                    let converted = map.next_value_seed(Convert(self.kinds[i].kind))?;
                    self.out[i] = converted.unwrap_or(ColumnValue::Null);
                }
                None => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// A JSON value in a few words: its kind, and a short one's text.
fn describe(value: &serde_json::Value) -> String {
    use serde_json::Value;
    let text = |kind: &str| {
        let shown = value.to_string();
        if shown.chars().count() <= 40 {
            format!("{kind} {shown}")
        } else {
            format!("{kind} {}...", shown.chars().take(40).collect::<String>())
        }
    };
    match value {
        Value::Null => "null".into(),
        Value::Bool(_) => text("a boolean"),
        Value::Number(_) => text("a number"),
        Value::String(_) => text("a string"),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// Longest string kept as a segment's least or greatest value of a column; past it neither is
/// kept (a reader then reads the segment rather than skip it by a bound it cannot trust).
pub const STATS_STRING_BYTES_MAX: usize = 64;

/// What one segment holds of a column: its least and greatest values (JSON numbers, strings and
/// booleans; a timestamp as its microseconds) and how many of its rows are null. Recorded in
/// the manifest, so a Delta log's statistics are written without reading the segment again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnStats {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: ColumnType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<serde_json::Value>,
    pub nulls: u64,
}

/// Gathers one column's `ColumnStats` over a segment's values.
#[derive(Debug)]
pub struct StatsBuilder {
    name: String,
    kind: ColumnType,
    min: Option<ColumnValue>,
    max: Option<ColumnValue>,
    nulls: u64,
    /// A string past `STATS_STRING_BYTES_MAX` was seen: no bounds are kept.
    unbounded: bool,
}

impl StatsBuilder {
    pub fn new(name: &str, kind: ColumnType) -> StatsBuilder {
        StatsBuilder { name: name.to_string(), kind, min: None, max: None, nulls: 0, unbounded: false }
    }

    pub fn add(&mut self, value: &ColumnValue) {
        if *value == ColumnValue::Null {
            self.nulls += 1;
            return;
        }
        if let ColumnValue::String(s) = value
            && s.len() > STATS_STRING_BYTES_MAX
        {
            self.unbounded = true;
        }
        if self.min.as_ref().is_none_or(|min| compare(value, min).is_some_and(|o| o.is_lt())) {
            self.min = Some(value.clone());
        }
        if self.max.as_ref().is_none_or(|max| compare(max, value).is_some_and(|o| o.is_lt())) {
            self.max = Some(value.clone());
        }
    }

    /// `add` for a text value, copied only when it becomes a bound (most rows of a segment are
    /// neither its least nor its greatest).
    pub fn add_text(&mut self, value: Option<&str>) {
        let Some(text) = value else {
            self.nulls += 1;
            return;
        };
        if text.len() > STATS_STRING_BYTES_MAX {
            self.unbounded = true;
        }
        if !matches!(&self.min, Some(ColumnValue::String(min)) if min.as_bytes() <= text.as_bytes()) {
            self.min = Some(ColumnValue::String(text.to_string()));
        }
        if !matches!(&self.max, Some(ColumnValue::String(max)) if max.as_bytes() >= text.as_bytes()) {
            self.max = Some(ColumnValue::String(text.to_string()));
        }
    }

    pub fn finish(self) -> ColumnStats {
        let bound = |v: Option<ColumnValue>| if self.unbounded { None } else { v.and_then(json_of) };
        ColumnStats {
            min: bound(self.min.clone()),
            max: bound(self.max.clone()),
            name: self.name,
            kind: self.kind,
            nulls: self.nulls,
        }
    }
}

fn json_of(value: ColumnValue) -> Option<serde_json::Value> {
    Some(match value {
        ColumnValue::Null => return None,
        ColumnValue::String(s) => s.into(),
        ColumnValue::Int64(n) | ColumnValue::Timestamp(n) => n.into(),
        ColumnValue::Float64(f) => serde_json::Number::from_f64(f)?.into(),
        ColumnValue::Bool(b) => b.into(),
    })
}

/// Conditions one query takes at most.
pub const QUERY_CONDITIONS_MAX: usize = 16;

/// How a condition compares a column with its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comparison {
    Eq,
    Lt,
    Le,
    Gt,
    Ge,
}

/// A query's condition on a declared column (`carrier=AA`, `dep_delay>=10`,
/// `sched_dep<2024-01-02T00:00:00Z`): a record is kept when its column's value (as archival
/// stores it: `ColumnSpec::extract_or_null`) compares so; a null never does.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub column: ColumnSpec,
    pub op: Comparison,
    pub value: ColumnValue,
}

impl Condition {
    /// Parses `NAME OP VALUE` (OP one of `=`, `<`, `<=`, `>`, `>=`; no spaces needed) against
    /// the table's `columns`; the value is read as the column's type (a timestamp in RFC 3339
    /// or integer microseconds).
    pub fn parse(text: &str, table: &str, columns: &[ColumnSpec]) -> Result<Condition> {
        let invalid = |why: String| Error::InvalidInput(format!("condition `{text}`: {why}"));
        let at = text.find(['=', '<', '>']).ok_or_else(|| {
            invalid("write it as a column, an operator (=, <, <=, >, >=) and a value: carrier=AA, dep_delay>=10".into())
        })?;
        let (name, rest) = (text[..at].trim(), &text[at..]);
        let (op, value) = match rest.as_bytes() {
            [b'<', b'=', ..] => (Comparison::Le, &rest[2..]),
            [b'>', b'=', ..] => (Comparison::Ge, &rest[2..]),
            [b'<', ..] => (Comparison::Lt, &rest[1..]),
            [b'>', ..] => (Comparison::Gt, &rest[1..]),
            _ => (Comparison::Eq, &rest[1..]),
        };
        let column = columns.iter().find(|c| c.name == name).ok_or_else(|| {
            let declared: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
            invalid(format!(
                "table `{table}` declares no column `{name}`; a query filters on declared columns ({})",
                if declared.is_empty() { "it declares none".to_string() } else { declared.join(", ") }
            ))
        })?;
        let typed = |kind: &str| invalid(format!("`{value}` is not {kind}, the type of column `{name}`"));
        let value = match column.kind {
            ColumnType::String => ColumnValue::String(value.to_string()),
            ColumnType::Int64 => ColumnValue::Int64(value.trim().parse().map_err(|_| typed("an int64"))?),
            ColumnType::Float64 => match value.trim().parse::<f64>() {
                Ok(f) if f.is_finite() => ColumnValue::Float64(f),
                _ => return Err(typed("a finite float64")),
            },
            ColumnType::Bool => match value.trim() {
                "true" => ColumnValue::Bool(true),
                "false" => ColumnValue::Bool(false),
                _ => return Err(typed("a bool (true or false)")),
            },
            ColumnType::Timestamp => ColumnValue::Timestamp(
                super::time::parse_time_arg(value).map_err(|_| typed("a timestamp (RFC 3339 or microseconds)"))?,
            ),
        };
        Ok(Condition { column: column.clone(), op, value })
    }

    /// Whether the record whose body is `body` meets the condition.
    pub fn holds(&self, body: &Body) -> bool {
        self.compares(&self.column.extract_or_null(body))
    }

    fn compares(&self, value: &ColumnValue) -> bool {
        let Some(order) = compare(value, &self.value) else { return false };
        match self.op {
            Comparison::Eq => order.is_eq(),
            Comparison::Lt => order.is_lt(),
            Comparison::Le => order.is_le(),
            Comparison::Gt => order.is_gt(),
            Comparison::Ge => order.is_ge(),
        }
    }

    /// Whether a segment of `rows` rows with these statistics may hold a record that meets the
    /// condition: `false` only when its bounds (or its nulls) rule every row out. A segment
    /// without statistics for the column (older, or of another format) may.
    pub fn may_hold_in(&self, stats: &[ColumnStats], rows: u64) -> bool {
        let Some(stats) = stats.iter().find(|s| s.name == self.column.name && s.kind == self.column.kind) else {
            return true;
        };
        if stats.nulls >= rows {
            return false;
        }
        let bound = |v: &Option<serde_json::Value>| v.as_ref().and_then(|v| value_of(self.column.kind, v));
        let (Some(min), Some(max)) = (bound(&stats.min), bound(&stats.max)) else { return true };
        let (low, high) = (compare(&min, &self.value), compare(&max, &self.value));
        match self.op {
            Comparison::Eq => low.is_none_or(|o| o.is_le()) && high.is_none_or(|o| o.is_ge()),
            Comparison::Lt => low.is_none_or(|o| o.is_lt()),
            Comparison::Le => low.is_none_or(|o| o.is_le()),
            Comparison::Gt => high.is_none_or(|o| o.is_gt()),
            Comparison::Ge => high.is_none_or(|o| o.is_ge()),
        }
    }
}

/// Parses a query's conditions (`Condition::parse`), at most `QUERY_CONDITIONS_MAX`.
pub fn parse_conditions(texts: &[String], table: &str, columns: &[ColumnSpec]) -> Result<Vec<Condition>> {
    if texts.len() > QUERY_CONDITIONS_MAX {
        return Err(Error::InvalidInput(format!(
            "{} conditions; a query takes at most {QUERY_CONDITIONS_MAX}",
            texts.len()
        )));
    }
    texts.iter().map(|text| Condition::parse(text, table, columns)).collect()
}

/// The order of two values of one column; `None` when either is null (or they differ in type).
fn compare(a: &ColumnValue, b: &ColumnValue) -> Option<std::cmp::Ordering> {
    Some(match (a, b) {
        (ColumnValue::String(a), ColumnValue::String(b)) => a.as_bytes().cmp(b.as_bytes()),
        (ColumnValue::Int64(a), ColumnValue::Int64(b)) => a.cmp(b),
        (ColumnValue::Float64(a), ColumnValue::Float64(b)) => a.total_cmp(b),
        (ColumnValue::Bool(a), ColumnValue::Bool(b)) => a.cmp(b),
        (ColumnValue::Timestamp(a), ColumnValue::Timestamp(b)) => a.cmp(b),
        _ => return None,
    })
}

/// A bound as `ColumnStats` keeps it (JSON; a timestamp as microseconds), as a value.
fn value_of(kind: ColumnType, json: &serde_json::Value) -> Option<ColumnValue> {
    Some(match kind {
        ColumnType::String => ColumnValue::String(json.as_str()?.to_string()),
        ColumnType::Int64 => ColumnValue::Int64(json.as_i64()?),
        ColumnType::Float64 => ColumnValue::Float64(json.as_f64()?),
        ColumnType::Bool => ColumnValue::Bool(json.as_bool()?),
        ColumnType::Timestamp => ColumnValue::Timestamp(json.as_i64()?),
    })
}

/// Checks a table's declared columns, as a policy file declares them: names, pointers, limits.
pub fn validate(columns: &[ColumnSpec]) -> std::result::Result<(), String> {
    if columns.len() > COLUMNS_MAX {
        return Err(format!("{} columns are declared; at most {COLUMNS_MAX} are allowed", columns.len()));
    }
    for (i, column) in columns.iter().enumerate() {
        let name = &column.name;
        let valid_name = !name.is_empty()
            && name.len() <= COLUMN_NAME_BYTES_MAX
            && name.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !valid_name {
            return Err(format!(
                "column `{name}`: a name is 1 to {COLUMN_NAME_BYTES_MAX} bytes of a-z, 0-9 and _, not starting \
                 with a digit"
            ));
        }
        if RESERVED_COLUMN_NAMES.contains(&name.as_str()) {
            return Err(format!(
                "column `{name}`: the name is frostline's own column ({}); choose another",
                RESERVED_COLUMN_NAMES.join(", ")
            ));
        }
        if columns[..i].iter().any(|c| &c.name == name) {
            return Err(format!("column `{name}` is declared twice"));
        }
        validate_pointer(&column.from).map_err(|why| format!("column `{name}`: from = {:?}: {why}", column.from))?;
        if column.on_mismatch == OnMismatch::Null && !column.nullable {
            return Err(format!(
                "column `{name}`: on_mismatch = \"null\" stores null, so the column must be nullable \
                 (remove nullable = false, or use on_mismatch = \"refuse\")"
            ));
        }
    }
    Ok(())
}

fn validate_pointer(pointer: &str) -> std::result::Result<(), String> {
    if pointer.len() > COLUMN_POINTER_BYTES_MAX {
        return Err(format!("a pointer is at most {COLUMN_POINTER_BYTES_MAX} bytes"));
    }
    if !pointer.is_empty() && !pointer.starts_with('/') {
        return Err("a JSON pointer starts with `/` (RFC 6901): from = \"/carrier\"".into());
    }
    let bytes = pointer.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'~' && !matches!(bytes.get(i + 1), Some(b'0' | b'1')) {
            return Err("`~` is written `~0` and `/` inside a name `~1` (RFC 6901)".into());
        }
    }
    Ok(())
}

/// What a table's new columns may change of its recorded ones (`recorded`): columns are only
/// added, nullable, since older segments hold none of them. Removing a column, changing its type
/// or its source, or making it required, would make the archive's files disagree.
pub fn check_evolution(recorded: &[ColumnSpec], declared: &[ColumnSpec]) -> std::result::Result<(), String> {
    let fix = "a column never changes once declared: declare a new table id for the new shape, or add a new \
               nullable column";
    for old in recorded {
        let Some(new) = declared.iter().find(|c| c.name == old.name) else {
            return Err(format!("column `{}` ({}) is no longer declared; {fix}", old.name, old.describe()));
        };
        if new.kind != old.kind || new.from != old.from {
            return Err(format!("column `{}` changes from {} to {}; {fix}", old.name, old.describe(), new.describe()));
        }
        if old.nullable && !new.nullable {
            return Err(format!("column `{}` becomes required (nullable = false); {fix}", old.name));
        }
    }
    if let Some(new) = declared.iter().find(|c| !c.nullable && !recorded.iter().any(|old| old.name == c.name))
        && !recorded.is_empty()
    {
        return Err(format!(
            "column `{}` is added as required (nullable = false), but the table's earlier segments hold no value \
             for it: add it as nullable",
            new.name
        ));
    }
    Ok(())
}

/// Checks records against a table's columns before an append writes anything: returns how many
/// values were stored as null under `on_mismatch = "null"`, or refuses the batch at the first
/// value that does not fit a column that refuses (naming the record, 1-based, and the column).
pub fn check_records(columns: &[ColumnSpec], records: &[Record]) -> Result<u64> {
    let mut misses = 0;
    for (i, record) in records.iter().enumerate() {
        misses += check_record(columns, record)
            .map_err(|why| Error::InvalidInput(format!("record {}: {why}; nothing of the batch was written", i + 1)))?;
    }
    Ok(misses)
}

/// One record against a table's columns: the values it would store as null (`on_mismatch =
/// "null"`), or why a column refuses it.
pub fn check_record(columns: &[ColumnSpec], record: &Record) -> std::result::Result<u64, String> {
    if columns.is_empty() {
        return Ok(0);
    }
    let body = Body::parse(&record.body).map_err(|e| format!("body is not JSON: {e}"))?;
    let mut misses = 0;
    for column in columns {
        match column.extract(&body) {
            Ok(_) => {}
            Err(_) if column.on_mismatch == OnMismatch::Null => misses += 1,
            Err(Mismatch(found)) => {
                return Err(format!(
                    "column `{}` ({}{}, from `{}`) expects {}, found {found}. Fix the record, or declare the column \
                     with on_mismatch = \"null\" to store null and count the miss",
                    column.name,
                    column.kind.name(),
                    if column.nullable { ", nullable" } else { "" },
                    column.from,
                    column.kind.expects(),
                ));
            }
        }
    }
    Ok(misses)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn column(name: &str, kind: ColumnType, from: &str) -> ColumnSpec {
        ColumnSpec { from: from.into(), ..ColumnSpec::nullable(name, kind) }
    }

    fn record(body: &str) -> Record {
        Record {
            partition_key: b"p".to_vec(),
            event_time: 0,
            sort_key: b"s".to_vec(),
            tenant: None,
            kind: None,
            body: body.into(),
        }
    }

    /// The one-scan `Extractor` takes out exactly what `extract_or_null` does, column by
    /// column, over bodies of every shape that could tell them apart.
    #[test]
    fn the_one_scan_extractor_agrees_with_the_general_path_on_every_body() {
        let bodies = [
            r#"{"s":"AA","i":-3,"f":1400.5,"b":true,"t":"2013-01-01T05:15:00+01:00","site a%20=ü":"LGA t"}"#,
            r#"{"s":3,"i":"3","f":"1.5","b":1,"t":"yesterday"}"#,
            r#"{"s":null,"i":null,"f":null,"b":null,"t":null}"#,
            r#"{"i":1.0,"f":7,"t":"9999-12-31T23:59:59Z","x":{"i":5}}"#,
            r#"{"i":18446744073709551615,"f":18446744073709551615,"s":["a"],"b":{"b":true}}"#,
            r#"{"i":9223372036854775807,"f":1e400,"s":"x"}"#,
            r#"{"i":-9223372036854775808,"f":-0,"s":"caf\u00e9 \"q\" site a/%20=ü"}"#,
            r#"{"i":1,"i":"two","s":"first","s":"last","caf\u00e9":"escaped key"}"#,
            r#"{"i":1} trailing"#,
            r#"{"i":1"#,
            r#"[{"i":1}]"#,
            r#""just a string""#,
            "42",
            "",
            "  {\"t\": \"2024-02-29T12:00:00Z\", \"b\": false}  ",
        ];
        let top = [
            column("s", ColumnType::String, "/s"),
            column("i", ColumnType::Int64, "/i"),
            column("f", ColumnType::Float64, "/f"),
            column("b", ColumnType::Bool, "/b"),
            column("t", ColumnType::Timestamp, "/t"),
            column("e", ColumnType::String, "/café"),
            column("k", ColumnType::String, "/site a%20=ü"),
        ];
        let nested = [column("i", ColumnType::Int64, "/x/i"), column("s", ColumnType::String, "/s")];
        let shared = [column("i", ColumnType::Int64, "/i"), column("f", ColumnType::Float64, "/i")];
        let whole = [column("w", ColumnType::String, "")];
        let mut values = Vec::new();
        for columns in [&top[..], &nested[..], &shared[..], &whole[..], &[]] {
            let extractor = Extractor::new(columns);
            for body in bodies {
                extractor.values(body, &mut values);
                let general: Vec<ColumnValue> = match Body::parse(body) {
                    Ok(parsed) => columns.iter().map(|c| c.extract_or_null(&parsed)).collect(),
                    Err(_) => vec![ColumnValue::Null; columns.len()],
                };
                assert_eq!(values, general, "{body} {columns:?}");
            }
        }
        assert!(Extractor::new(&top).fields.is_some(), "top-level fields take the one scan");
        assert!(Extractor::new(&nested).fields.is_none() && Extractor::new(&shared).fields.is_none());
        // What the bodies above hold, so that agreement is not agreement on nulls alone.
        Extractor::new(&top).values(bodies[0], &mut values);
        assert_eq!(
            values,
            [
                ColumnValue::String("AA".into()),
                ColumnValue::Int64(-3),
                ColumnValue::Float64(1400.5),
                ColumnValue::Bool(true),
                ColumnValue::Timestamp(1_357_013_700_000_000),
                ColumnValue::Null,
                ColumnValue::String("LGA t".into())
            ]
        );
        Extractor::new(&top).values(bodies[7], &mut values);
        assert_eq!(values[0], ColumnValue::String("last".into()));
        assert_eq!(values[1], ColumnValue::Null, "the last of a repeated field counts");
        assert_eq!(values[5], ColumnValue::String("escaped key".into()));
    }

    #[test]
    fn each_type_takes_its_json_values_and_refuses_the_others() {
        let text = serde_json::json!({
            "carrier": "AA", "delay": -3, "distance": 1400.5, "cancelled": false,
            "at": "2013-01-01T05:15:00+01:00", "nested": {"a/b": {"~x": 7}}, "none": null,
            "legs": [{"to": "JFK"}, {"to": "SFO"}], "big": u64::MAX, "twice": 1
        })
        .to_string()
        .replace("\"twice\":1", "\"twice\":1,\"twice\":2,\"caf\\u00e9\":\"au lait\"");
        let body = Body::parse(&text).unwrap();
        let value = |kind, from: &str| column("c", kind, from).extract(&body);
        assert_eq!(value(ColumnType::String, "/carrier"), Ok(ColumnValue::String("AA".into())));
        assert_eq!(value(ColumnType::Int64, "/delay"), Ok(ColumnValue::Int64(-3)));
        assert_eq!(value(ColumnType::Float64, "/distance"), Ok(ColumnValue::Float64(1400.5)));
        assert_eq!(value(ColumnType::Float64, "/delay"), Ok(ColumnValue::Float64(-3.0)));
        assert_eq!(value(ColumnType::Bool, "/cancelled"), Ok(ColumnValue::Bool(false)));
        assert_eq!(value(ColumnType::Timestamp, "/at"), Ok(ColumnValue::Timestamp(1_357_013_700_000_000)));
        assert_eq!(value(ColumnType::Int64, "/nested/a~1b/~0x"), Ok(ColumnValue::Int64(7)));
        assert_eq!(value(ColumnType::String, "/legs/1/to"), Ok(ColumnValue::String("SFO".into())));
        assert_eq!(value(ColumnType::String, "/legs/01/to"), Ok(ColumnValue::Null), "no leading zero in an index");
        assert_eq!(value(ColumnType::Int64, "/twice"), Ok(ColumnValue::Int64(2)), "a repeated key's last value");
        assert_eq!(value(ColumnType::String, "/café"), Ok(ColumnValue::String("au lait".into())), "an escaped key");
        // The same as serde_json's own pointer, over every pointer here.
        let value_of = serde_json::from_str::<serde_json::Value>(&text).unwrap();
        for pointer in [
            "/carrier",
            "/nested/a~1b/~0x",
            "/legs/1/to",
            "/legs/01/to",
            "/legs/9",
            "/twice",
            "/café",
            "/none",
            "/x/y",
            "",
        ] {
            let ours = body.at(pointer).map(|raw| serde_json::from_str::<serde_json::Value>(raw.get()).unwrap());
            assert_eq!(ours.as_ref(), value_of.pointer(pointer), "{pointer}");
        }
        assert_eq!(value(ColumnType::String, "/none"), Ok(ColumnValue::Null));
        assert_eq!(value(ColumnType::String, "/absent"), Ok(ColumnValue::Null));
        assert_eq!(value(ColumnType::Int64, "/distance"), Err(Mismatch("a number 1400.5".into())));
        assert_eq!(value(ColumnType::Int64, "/big"), Err(Mismatch("a number 18446744073709551615".into())));
        assert_eq!(value(ColumnType::Float64, "/big"), Ok(ColumnValue::Float64(u64::MAX as f64)));
        assert_eq!(value(ColumnType::String, "/delay"), Err(Mismatch("a number -3".into())));
        assert_eq!(value(ColumnType::Bool, "/carrier"), Err(Mismatch("a string \"AA\"".into())));
        assert_eq!(value(ColumnType::Timestamp, "/carrier"), Err(Mismatch("a string \"AA\"".into())));
        assert_eq!(value(ColumnType::Int64, "/nested"), Err(Mismatch("an object".into())));
        let required = ColumnSpec { nullable: false, ..column("c", ColumnType::String, "/none") };
        assert_eq!(required.extract(&body), Err(Mismatch("null".into())));
        let required = ColumnSpec { nullable: false, ..column("c", ColumnType::String, "/absent") };
        assert_eq!(required.extract(&body), Err(Mismatch("nothing there".into())));
        assert_eq!(required.extract_or_null(&body), ColumnValue::Null);
    }

    #[test]
    fn a_batch_with_a_value_that_does_not_fit_is_refused_naming_the_record_and_the_column() {
        let columns = [column("carrier", ColumnType::String, "/carrier"), column("delay", ColumnType::Int64, "/delay")];
        let good = record(r#"{"carrier":"AA","delay":3}"#);
        let bad = record(r#"{"carrier":"UA","delay":"late"}"#);
        assert_eq!(check_records(&columns, &[good.clone(), good.clone()]).unwrap(), 0);
        let error = check_records(&columns, &[good.clone(), bad.clone()]).unwrap_err().to_string();
        assert!(error.contains("record 2: column `delay` (int64, nullable, from `/delay`)"), "{error}");
        assert!(error.contains("found a string \"late\""), "{error}");
        assert!(error.contains("on_mismatch = \"null\""), "{error}");
        // Stored as null and counted instead, when the column says so.
        let lenient = [columns[0].clone(), ColumnSpec { on_mismatch: OnMismatch::Null, ..columns[1].clone() }];
        assert_eq!(check_records(&lenient, &[good, bad.clone(), bad]).unwrap(), 2);
    }

    #[test]
    fn declared_columns_are_checked_and_their_limits_hold() {
        let ok = |columns: &[ColumnSpec]| validate(columns);
        assert_eq!(
            ok(&[column("carrier", ColumnType::String, "/carrier"), column("_x9", ColumnType::Bool, "")]),
            Ok(())
        );
        for (name, from, expected) in [
            ("Carrier", "/c", "a name is 1 to 64 bytes"),
            ("9lives", "/c", "a name is 1 to 64 bytes"),
            ("", "/c", "a name is 1 to 64 bytes"),
            ("body", "/c", "frostline's own column"),
            ("partition", "/c", "frostline's own column"),
            ("c", "carrier", "starts with `/`"),
            ("c", "/a~2", "`~` is written `~0`"),
        ] {
            let error = ok(&[column(name, ColumnType::String, from)]).unwrap_err();
            assert!(error.contains(expected), "{name} {from}: {error}");
        }
        let twice = ok(&[column("c", ColumnType::String, "/a"), column("c", ColumnType::Int64, "/b")]).unwrap_err();
        assert!(twice.contains("declared twice"), "{twice}");
        let strict_null =
            ColumnSpec { nullable: false, on_mismatch: OnMismatch::Null, ..column("c", ColumnType::Bool, "/c") };
        assert!(ok(&[strict_null]).unwrap_err().contains("must be nullable"));
        // Limits: held at the bound, enforced past it.
        let longest = "n".repeat(COLUMN_NAME_BYTES_MAX);
        assert_eq!(ok(&[column(&longest, ColumnType::String, "/c")]), Ok(()));
        assert!(ok(&[column(&format!("{longest}n"), ColumnType::String, "/c")]).is_err());
        let deepest = format!("/{}", "p".repeat(COLUMN_POINTER_BYTES_MAX - 1));
        assert_eq!(ok(&[column("c", ColumnType::String, &deepest)]), Ok(()));
        assert!(ok(&[column("c", ColumnType::String, &format!("{deepest}p"))]).unwrap_err().contains("at most 256"));
        let most: Vec<ColumnSpec> =
            (0..COLUMNS_MAX).map(|i| column(&format!("c{i}"), ColumnType::Int64, &format!("/c{i}"))).collect();
        assert_eq!(ok(&most), Ok(()));
        let mut too_many = most;
        too_many.push(column("extra", ColumnType::Int64, "/extra"));
        assert!(ok(&too_many).unwrap_err().contains("at most 64"));
    }

    #[test]
    fn a_segments_statistics_bound_its_values_and_count_its_nulls() {
        let stats = |kind, values: &[ColumnValue]| {
            let mut builder = StatsBuilder::new("c", kind);
            values.iter().for_each(|v| builder.add(v));
            let stats = builder.finish();
            (stats.min, stats.max, stats.nulls)
        };
        use ColumnValue::*;
        let json = |v: serde_json::Value| Some(v);
        assert_eq!(
            stats(ColumnType::String, &[String("b".into()), Null, String("a".into()), String("é".into())]),
            (json("a".into()), json("é".into()), 1)
        );
        assert_eq!(stats(ColumnType::Int64, &[Int64(5), Int64(-7), Int64(3)]), (json((-7).into()), json(5.into()), 0));
        assert_eq!(
            stats(ColumnType::Float64, &[Float64(0.5), Float64(-1.25)]),
            (json((-1.25).into()), json(0.5.into()), 0)
        );
        assert_eq!(stats(ColumnType::Bool, &[Bool(true), Bool(false)]), (json(false.into()), json(true.into()), 0));
        assert_eq!(stats(ColumnType::Timestamp, &[Timestamp(9), Timestamp(2)]), (json(2.into()), json(9.into()), 0));
        assert_eq!(stats(ColumnType::Int64, &[Null, Null]), (None, None, 2));
        let mut text = StatsBuilder::new("c", ColumnType::String);
        [Some("b"), None, Some("a"), Some("é")].into_iter().for_each(|v| text.add_text(v));
        let text = text.finish();
        assert_eq!((text.min, text.max, text.nulls), (json("a".into()), json("é".into()), 1), "add_text bounds as add");
        // Limit: a string at the bound is kept as one; past it, no bound is kept.
        let at = "s".repeat(STATS_STRING_BYTES_MAX);
        assert_eq!(
            stats(ColumnType::String, &[String(at.clone())]),
            (json(at.clone().into()), json(at.clone().into()), 0)
        );
        assert_eq!(stats(ColumnType::String, &[String(at.clone() + "s"), String("a".into())]), (None, None, 0));
    }

    #[test]
    fn a_condition_keeps_the_records_it_names_and_rules_out_segments_by_their_bounds() {
        let columns = [
            column("carrier", ColumnType::String, "/carrier"),
            column("delay", ColumnType::Int64, "/delay"),
            column("at", ColumnType::Timestamp, "/at"),
        ];
        let parse = |text: &str| Condition::parse(text, "flights", &columns);
        let body = Body::parse(r#"{"carrier": "UA", "delay": 12, "at": "2024-01-02T00:00:00Z"}"#).unwrap();
        for (text, holds) in [
            ("carrier=UA", true),
            ("carrier=AA", false),
            ("carrier>B6", true),
            ("delay>=12", true),
            ("delay>12", false),
            ("delay<13", true),
            ("delay<=11", false),
            ("at<2024-01-02T00:00:01Z", true),
            ("at>=1704153600000001", false),
        ] {
            assert_eq!(parse(text).unwrap().holds(&body), holds, "{text}");
        }
        assert!(
            !parse("delay>0").unwrap().holds(&Body::parse(r#"{"delay": "late"}"#).unwrap()),
            "a null never matches"
        );
        for (text, why) in [
            ("gate=3", "declares no column `gate`"),
            ("delay=soon", "not an int64"),
            ("at>yesterday", "not a timestamp"),
            ("carrier", "an operator"),
        ] {
            let error = parse(text).unwrap_err().to_string();
            assert!(error.contains(why), "{text}: {error}");
        }
        // Limit: held at the bound, enforced past it.
        let most = vec!["delay>0".to_string(); QUERY_CONDITIONS_MAX];
        assert_eq!(parse_conditions(&most, "flights", &columns).unwrap().len(), QUERY_CONDITIONS_MAX);
        let too_many = vec!["delay>0".to_string(); QUERY_CONDITIONS_MAX + 1];
        assert!(parse_conditions(&too_many, "flights", &columns).unwrap_err().to_string().contains("at most 16"));
        // A segment whose bounds are [5, 9] holds no delay of 12; one without bounds may.
        let stats = |min: i64, max: i64, nulls| ColumnStats {
            name: "delay".into(),
            kind: ColumnType::Int64,
            min: Some(min.into()),
            max: Some(max.into()),
            nulls,
        };
        let delay = |text: &str| parse(text).unwrap();
        assert!(!delay("delay=12").may_hold_in(&[stats(5, 9, 0)], 10));
        assert!(delay("delay=7").may_hold_in(&[stats(5, 9, 0)], 10));
        assert!(!delay("delay>9").may_hold_in(&[stats(5, 9, 0)], 10));
        assert!(delay("delay>=9").may_hold_in(&[stats(5, 9, 0)], 10));
        assert!(!delay("delay<5").may_hold_in(&[stats(5, 9, 0)], 10));
        assert!(delay("delay<=5").may_hold_in(&[stats(5, 9, 0)], 10));
        assert!(delay("delay=12").may_hold_in(&[], 10), "no statistics: read it");
        let all_null = ColumnStats { min: None, max: None, ..stats(0, 0, 10) };
        assert!(!delay("delay=12").may_hold_in(&[all_null], 10), "every row null");
    }

    #[test]
    fn columns_are_only_ever_added_and_nullable() {
        let carrier = column("carrier", ColumnType::String, "/carrier");
        let delay = column("delay", ColumnType::Int64, "/delay");
        assert_eq!(check_evolution(std::slice::from_ref(&carrier), &[carrier.clone(), delay.clone()]), Ok(()));
        assert_eq!(check_evolution(&[], &[ColumnSpec { nullable: false, ..delay.clone() }]), Ok(()));
        let lenient = ColumnSpec { on_mismatch: OnMismatch::Null, ..carrier.clone() };
        assert_eq!(check_evolution(std::slice::from_ref(&carrier), &[lenient]), Ok(()));
        for (declared, expected) in [
            (vec![delay.clone()], "no longer declared"),
            (vec![ColumnSpec { kind: ColumnType::Int64, ..carrier.clone() }], "changes from"),
            (vec![ColumnSpec { from: "/airline".into(), ..carrier.clone() }], "changes from"),
            (vec![ColumnSpec { nullable: false, ..carrier.clone() }], "becomes required"),
            (vec![carrier.clone(), ColumnSpec { nullable: false, ..delay.clone() }], "add it as nullable"),
        ] {
            let error = check_evolution(std::slice::from_ref(&carrier), &declared).unwrap_err();
            assert!(error.contains(expected), "{error}");
        }
    }
}
