//! Canonical values as a JSON representation of jsonschema's own
//! ([`jsonschema::json::Json`]), so that a tool's input schema checks a
//! proposal's arguments where they are, instead of on a `serde_json` copy
//! made for every call. Numbers go through the conversion
//! [`to_serde_json`] uses, so that every rule reads a value exactly as it
//! did on that copy; only the cold paths (an error's instance, a
//! container's `const`, `enum` or `uniqueItems`) still build the copy.

use std::borrow::Cow;

use jsonschema::json::{self, Json, NodeIdentity};
use jsonschema::types::JsonType;

use super::{Object, Value, object_to_serde_json, serde_number, to_serde_json};

/// The representation: [`Validator<Canonical>`](jsonschema::Validator)
/// validates an [`Instance`].
#[derive(Debug)]
pub struct Canonical;

/// A value to validate: a whole value, or an object on its own (a
/// proposal's arguments are an [`Object`], not a [`Value`]).
#[derive(Debug, Clone, Copy)]
pub enum Instance<'a> {
    Value(&'a Value),
    Object(&'a Object),
}

impl Json for Canonical {
    type Node<'a> = Instance<'a>;
    type PreparedKey = Box<str>;
    type StringBuffer = ();

    // A lookup is a binary search over the sorted members, as serde_json's
    // ordered map is a tree search: the same trade-off as its setting.
    const KEYS_PER_LOOKUP: usize = 2;
    // Values own their children: no node is its own descendant.
    const ACYCLIC: bool = true;

    fn prepare_key(key: &str) -> Box<str> {
        key.into()
    }

    /// For `propertyNames` only.
    fn with_string_node<T>((): &mut (), string: &str, f: impl FnOnce(Instance<'_>) -> T) -> T {
        f(Instance::Value(&Value::String(string.to_owned())))
    }
}

impl<'a> Instance<'a> {
    /// The value itself, when it is one (not an object on its own).
    fn value(self) -> Option<&'a Value> {
        match self {
            Instance::Value(value) => Some(value),
            Instance::Object(_) => None,
        }
    }
}

impl<'a> json::Node<'a, Canonical> for Instance<'a> {
    type Object = &'a Object;
    type Array = &'a [Value];
    type Number = serde_json::Number;

    fn as_object(&self) -> Option<&'a Object> {
        match *self {
            Instance::Object(object) | Instance::Value(Value::Object(object)) => Some(object),
            Instance::Value(_) => None,
        }
    }

    fn as_array(&self) -> Option<&'a [Value]> {
        match self.value()? {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }

    fn as_string(&self) -> Option<Cow<'a, str>> {
        match self.value()? {
            Value::String(text) => Some(Cow::Borrowed(text)),
            _ => None,
        }
    }

    fn as_number(&self) -> Option<serde_json::Number> {
        match self.value()? {
            Value::Number(number) => serde_number(*number),
            _ => None,
        }
    }

    fn as_boolean(&self) -> Option<bool> {
        match self.value()? {
            Value::Bool(flag) => Some(*flag),
            _ => None,
        }
    }

    fn is_null(&self) -> bool {
        self.json_type() == JsonType::Null
    }

    fn json_type(&self) -> JsonType {
        match self.value() {
            None | Some(Value::Object(_)) => JsonType::Object,
            Some(Value::Null) => JsonType::Null,
            Some(Value::Bool(_)) => JsonType::Boolean,
            Some(Value::Number(number)) => match serde_number(*number) {
                Some(_) => JsonType::Number,
                None => JsonType::Null,
            },
            Some(Value::String(_)) => JsonType::String,
            Some(Value::Array(_)) => JsonType::Array,
        }
    }

    /// `minLength` and `maxLength` without counting when the length in
    /// bytes decides: a code point takes one to four bytes.
    fn string_length_within(&self, min: u64, max: u64) -> Option<bool> {
        let Some(Value::String(text)) = self.value() else {
            return None;
        };
        let bytes = text.len() as u64;
        let fewest = bytes.div_ceil(4);
        if bytes < min || fewest > max {
            return Some(false);
        }
        if min <= fewest && bytes <= max {
            return Some(true);
        }
        Some((min..=max).contains(&(text.chars().count() as u64)))
    }

    /// Scalars compared in place; containers through the copy.
    fn equals_value(&self, expected: &serde_json::Value) -> bool {
        match self.value() {
            Some(Value::Null) => expected.is_null(),
            Some(Value::Bool(flag)) => expected.as_bool() == Some(*flag),
            Some(Value::String(text)) => expected.as_str() == Some(text.as_str()),
            Some(Value::Number(number)) => match serde_number(*number) {
                Some(number) => json::cmp::equal(&serde_json::Value::Number(number), expected),
                None => expected.is_null(),
            },
            Some(Value::Array(_) | Value::Object(_)) | None => {
                json::cmp::equal(&self.to_value(), expected)
            }
        }
    }

    fn to_value(&self) -> Cow<'a, serde_json::Value> {
        Cow::Owned(match *self {
            Instance::Value(value) => to_serde_json(value),
            Instance::Object(object) => object_to_serde_json(object),
        })
    }

    fn identity(&self) -> Option<NodeIdentity> {
        // Every node is a distinct place in memory: the one object on its
        // own is the root, and every other node is a value inside it.
        let address = match *self {
            Instance::Value(value) => std::ptr::from_ref(value) as usize,
            Instance::Object(object) => std::ptr::from_ref(object) as usize,
        };
        Some(NodeIdentity::new(address))
    }
}

/// An object's members, in key order.
#[derive(Debug)]
pub struct Members<'a>(std::slice::Iter<'a, (String, Value)>);

impl<'a> Iterator for Members<'a> {
    type Item = (&'a str, Instance<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        self.0
            .next()
            .map(|(key, value)| (key.as_str(), Instance::Value(value)))
    }
}

impl<'a> json::Object<'a, Canonical> for &'a Object {
    type Node = Instance<'a>;
    type MemberName = &'a str;
    type MembersIter = Members<'a>;

    fn len(&self) -> usize {
        Object::len(self)
    }

    fn get(&self, key: &Box<str>) -> Option<Instance<'a>> {
        Object::get(self, key).map(Instance::Value)
    }

    fn members(&self) -> Members<'a> {
        let object: &'a Object = self;
        Members(object.members.iter())
    }
}

impl<'a> json::Array<'a, Canonical> for &'a [Value] {
    type Node = Instance<'a>;
    type ElementsIter = std::iter::Map<std::slice::Iter<'a, Value>, fn(&'a Value) -> Instance<'a>>;

    fn len(&self) -> usize {
        <[Value]>::len(self)
    }

    fn elements(&self) -> Self::ElementsIter {
        let items: &'a [Value] = self;
        items.iter().map(Instance::Value)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::domain::canonical::parse_str;

    /// Schemas over the keywords a tool's input schema uses, numbers of
    /// every kind (draft 4's integers by their written form included).
    fn schemas() -> Vec<serde_json::Value> {
        vec![
            json!({"type": "object", "required": ["a"], "additionalProperties": false,
                   "properties": {
                       "a": {"type": "integer"},
                       "b": {"type": "number", "minimum": 0, "exclusiveMaximum": 100},
                       "c": {"type": "string", "minLength": 2, "maxLength": 5, "pattern": "^[a-z]+$"},
                       "d": {"type": "array", "items": {"type": ["string", "null"]},
                             "uniqueItems": true, "maxItems": 3},
                       "e": {"enum": [1, "x", null, [1, 2], {"k": 1}]},
                       "f": {"const": 1.0},
                       "g": {"type": "boolean"}}}),
            json!({"type": "object", "propertyNames": {"pattern": "^[a-c]$"},
                   "minProperties": 1, "maxProperties": 3}),
            json!({"$defs": {"pos": {"type": "integer", "minimum": 1}}, "type": "object",
                   "properties": {
                       "a": {"$ref": "#/$defs/pos"},
                       "b": {"oneOf": [{"type": "string"}, {"type": "integer", "multipleOf": 2}]},
                       "c": {"not": {"type": "null"}},
                       "d": {"anyOf": [{"type": "array", "contains": {"const": "x"}},
                                       {"type": "object", "required": ["a"]}]}},
                   "dependentRequired": {"a": ["b"]},
                   "patternProperties": {"^x": {"type": "number", "multipleOf": 0.5}}}),
            json!({"type": "object",
                   "additionalProperties": {"type": "integer", "minimum": -5, "maximum": 5}}),
            json!({"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
                   "properties": {"a": {"type": "integer"}, "b": {"type": "number", "maximum": 1e300}}}),
            json!({"type": "object", "if": {"properties": {"a": {"const": 1}}},
                   "then": {"required": ["b"]}, "else": {"required": ["c"]}}),
            json!({"type": "object", "properties": {"a": {}}, "unevaluatedProperties": false}),
            json!({"type": "object", "properties": {"d": {"type": "array", "uniqueItems": true},
                   "c": {"minLength": 2, "maxLength": 3},
                   "e": {"const": [1, {"k": "x"}]}}}),
        ]
    }

    fn scalar() -> impl Strategy<Value = serde_json::Value> {
        prop_oneof![
            Just(json!(null)),
            any::<bool>().prop_map(|flag| json!(flag)),
            (-8i64..8).prop_map(|int| json!(int)),
            prop_oneof![Just(i64::MIN), Just(i64::MAX)].prop_map(|int| json!(int)),
            Just(json!(u64::MAX)),
            prop_oneof![
                Just(1.0),
                Just(-0.0),
                Just(0.5),
                Just(1.5),
                Just(2.0),
                Just(99.99),
                Just(1e300),
                Just(-2.5e-7)
            ]
            .prop_map(|float| json!(float)),
            "[a-z]{0,6}|[A-Z0-9 é😀\"\\\\]{0,4}|x".prop_map(|text| json!(text)),
        ]
    }

    fn value() -> impl Strategy<Value = serde_json::Value> {
        scalar().prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
                prop::collection::btree_map("[a-ek]", inner, 0..3)
                    .prop_map(|members| json!(members)),
            ]
        })
    }

    /// The names the schemas give rules to, and one they do not.
    const NAMES: [&str; 10] = ["a", "b", "c", "d", "e", "f", "g", "k", "xa", "zz"];

    fn arguments() -> impl Strategy<Value = serde_json::Value> {
        prop::collection::btree_map(prop::sample::select(&NAMES[..]), value(), 0..5)
            .prop_map(|members| json!(members))
    }

    /// What an error says: where, by which rule, and its message.
    fn first_error<'a, F: Json>(
        validator: &'a jsonschema::Validator<F>,
        instance: F::Node<'a>,
    ) -> Option<(String, String, String, String)> {
        validator.iter_errors(instance).next().map(|error| {
            (
                error.instance_path().as_str().to_owned(),
                error.schema_path().as_str().to_owned(),
                error.kind().keyword().to_owned(),
                error.to_string(),
            )
        })
    }

    /// Asserts that validating `arguments` in place says exactly what
    /// validating their serde_json copy says: valid or not, and the first
    /// error.
    fn assert_agree(schema: &serde_json::Value, arguments: &str) {
        let in_place = jsonschema::options_for::<Canonical>()
            .build(schema)
            .unwrap();
        let copied = jsonschema::options().build(schema).unwrap();
        let Ok(Value::Object(object)) = parse_str(arguments) else {
            panic!("{arguments} is an object");
        };
        let copy = object_to_serde_json(&object);
        let instance = Instance::Object(&object);
        let context = format!("{schema} on {arguments}");
        assert_eq!(
            in_place.is_valid(instance),
            copied.is_valid(&copy),
            "{context}"
        );
        assert_eq!(
            first_error(&in_place, instance),
            first_error(&copied, &copy),
            "{context}"
        );
    }

    proptest::proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn in_place_validation_agrees_with_the_serde_json_copy(
            arguments in arguments(),
            which in 0..8usize,
        ) {
            assert_agree(&schemas()[which], &arguments.to_string());
        }
    }

    /// Every name with every kind of scalar (numbers as written: `1` and
    /// `1.0` are told apart by draft 4), alone and inside containers, under
    /// every schema.
    #[test]
    fn every_scalar_under_every_schema_agrees() {
        let scalars = [
            "null",
            "true",
            "false",
            "\"\"",
            "\"x\"",
            "\"y\"",
            "\"ab\"",
            "\"é😀\"",
            "\"ééé\"",
            "\"éééé\"",
            "\"abcd\"",
            "0",
            "1",
            "-1",
            "2",
            "1.0",
            "-0.0",
            "1.5",
            "0.5",
            "2.0",
            "1e2",
            "1E-2",
            "1e300",
            "9223372036854775807",
            "-9223372036854775808",
            "18446744073709551615",
        ];
        for schema in schemas() {
            for name in NAMES {
                for scalar in scalars {
                    assert_agree(&schema, &format!("{{\"{name}\": {scalar}}}"));
                    assert_agree(
                        &schema,
                        &format!("{{\"{name}\": [{scalar}, {{\"k\": {scalar}}}]}}"),
                    );
                }
            }
        }
    }

    #[test]
    fn every_schema_is_met_and_failed_by_some_arguments() {
        // The comparisons above mean something only if each schema can go
        // either way.
        let met = [
            "{\"a\": 1}",
            "{\"a\": 1, \"b\": 2}",
            "{\"a\": 2, \"b\": 4}",
            "{}",
        ];
        let failed = [
            "{\"a\": \"x\"}",
            "{\"zz\": 1}",
            "{\"a\": 0, \"xa\": 0.3}",
            "{\"a\": 1.5}",
            "{\"d\": [1, 1]}",
        ];
        for schema in schemas() {
            let validator = jsonschema::options_for::<Canonical>()
                .build(&schema)
                .unwrap();
            let outcome = |text: &str| match parse_str(text) {
                Ok(Value::Object(object)) => validator.is_valid(Instance::Object(&object)),
                other => panic!("{other:?}"),
            };
            assert!(met.iter().any(|text| outcome(text)), "{schema}");
            assert!(failed.iter().any(|text| !outcome(text)), "{schema}");
        }
    }
}
