//! RFC 8941 parsing cases. The case list follows the categories and many of
//! the cases of the HTTP WG's `structured-field-tests` suite
//! (github.com/httpwg/structured-field-tests: dictionary.json,
//! param-dict.json, number.json, string.json, token.json, binary.json,
//! boolean.json, key-generated.json), rewritten here as Rust tables rather
//! than copied: each case is the raw field lines and the canonical
//! serialisation of what must be parsed (None: parsing must fail). Item
//! cases are checked as the value of a dictionary member `a=`.

use super::*;

/// Parse `raw` as a Dictionary and compare its serialisation.
fn check(name: &str, raw: &[&str], canonical: Option<&str>) {
    let parsed = parse_dictionary_lines(raw.iter().map(|l| l.as_bytes()));
    match (parsed, canonical) {
        (Ok(d), Some(c)) => {
            let s = serialize_dictionary(&d).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(s, c, "{name}: {raw:?}");
            // The canonical form parses to the same value.
            assert_eq!(parse_dictionary(s.as_bytes()), Ok(d), "{name}: round trip");
        }
        (Err(e), Some(c)) => panic!("{name}: {raw:?} must parse as {c:?}, failed: {e}"),
        (Ok(d), None) => panic!("{name}: {raw:?} must fail, parsed as {d:?}"),
        (Err(_), None) => {}
    }
}

/// An Item case: `raw` is the item's text, checked as `a=raw`. Leading and
/// trailing SP of a top-level Item are discarded (§4.2 steps 2 and 6), so
/// they are dropped here; anything else stays.
fn item(name: &str, raw: &str, canonical: Option<&str>) {
    let raw = format!("a={}", raw.trim_matches(' '));
    check(
        name,
        &[&raw],
        canonical.map(|c| format!("a={c}")).as_deref(),
    );
}

#[test]
fn dictionaries() {
    let cases: &[(&str, &[&str], Option<&str>)] = &[
        (
            "basic",
            &["en=\"Applepie\", da=:w4ZibGV0w6ZydGUK:"],
            Some("en=\"Applepie\", da=:w4ZibGV0w6ZydGUK:"),
        ),
        ("empty", &[""], Some("")),
        ("single item", &["a=1"], Some("a=1")),
        ("list item", &["a=(1 2)"], Some("a=(1 2)")),
        ("single list item", &["a=(1)"], Some("a=(1)")),
        ("empty list item", &["a=()"], Some("a=()")),
        ("no whitespace", &["a=1,b=2"], Some("a=1, b=2")),
        ("extra whitespace", &["a=1 ,  b=2"], Some("a=1, b=2")),
        ("tab separated", &["a=1\t,\tb=2"], Some("a=1, b=2")),
        ("leading whitespace", &["     a=1 ,  b=2"], Some("a=1, b=2")),
        ("trailing whitespace", &["a=1 ,  b=2   "], Some("a=1, b=2")),
        ("leading tab", &["\ta=1"], None),
        ("whitespace before =", &["a =1, b=2"], None),
        ("whitespace after =", &["a=1, b= 2"], None),
        ("two lines", &["a=1", "b=2"], Some("a=1, b=2")),
        ("missing value", &["a=1, b, c=3"], Some("a=1, b, c=3")),
        ("all missing value", &["a, b, c"], Some("a, b, c")),
        ("start missing value", &["a, b=2"], Some("a, b=2")),
        ("end missing value", &["a=1, b"], Some("a=1, b")),
        (
            "missing value with params",
            &["a=1, b;foo=9, c=3"],
            Some("a=1, b;foo=9, c=3"),
        ),
        (
            "explicit true value with params",
            &["a=1, b=?1;foo=9, c=3"],
            Some("a=1, b;foo=9, c=3"),
        ),
        ("explicit false", &["a=?0"], Some("a=?0")),
        ("trailing comma", &["a=1, b=2,"], None),
        ("trailing comma and space", &["a=1, b=2, "], None),
        ("empty item", &["a=1,,b=2,"], None),
        ("leading comma", &[",a=1"], None),
        ("duplicate key", &["a=1,b=2,a=3"], Some("a=3, b=2")),
        ("duplicate key, value then boolean", &["a=1,a"], Some("a")),
        ("numeric key", &["a=1,1b=2,a=1"], None),
        ("uppercase key", &["a=1,B=2,a=1"], None),
        ("bad key", &["a=1,b!=2,a=1"], None),
        ("star key", &["*a=1"], Some("*a=1")),
        (
            "key with every allowed character",
            &["a0_-.*=1"],
            Some("a0_-.*=1"),
        ),
        ("key starting with digit", &["0a=1"], None),
        ("key starting with underscore", &["_a=1"], None),
        ("no comma between members", &["a=1 b=2"], None),
        ("semicolon between members", &["a=1;b=2"], Some("a=1;b=2")),
        ("non-ASCII", &["a=\"\u{e9}\""], None),
        ("non-ASCII after the value", &["a=1 \u{e9}"], None),
        ("an empty line joined", &["a=1", ""], None),
        (
            "inner list with params",
            &["a=(1;x 2);y=?0"],
            Some("a=(1;x 2);y=?0"),
        ),
        (
            "inner list extra spaces",
            &["a=(  1   2  )"],
            Some("a=(1 2)"),
        ),
        ("inner list tab", &["a=(1\t2)"], None),
        ("inner list unterminated", &["a=(1 2"], None),
        ("inner list unterminated after space", &["a=(1 "], None),
        ("inner list no space", &["a=(1\"x\")"], None),
        ("nested inner list", &["a=((1))"], None),
        ("inner list in params", &["a=1;b=(1)"], None),
        ("whitespace before ;", &["a=b ;q=0.5"], None),
        ("whitespace after ;", &["a=b; q=0.5"], Some("a=b;q=0.5")),
        ("tab after ;", &["a=b;\tq=0.5"], None),
        ("whitespace before = in params", &["a=b;q =0.5"], None),
        ("whitespace after = in params", &["a=b;q= 0.5"], None),
        ("params on missing value", &["a;q"], Some("a;q")),
        ("param duplicate key", &["a=1;q=1;r;q=2"], Some("a=1;q=2;r")),
        ("param uppercase key", &["a=1;Q=1"], None),
        ("param trailing ;", &["a=1;"], None),
        (
            "basic parameterised",
            &["abc=123;a=1;b=2, def=456, ghi=789;q=9;r=\"+w\""],
            Some("abc=123;a=1;b=2, def=456, ghi=789;q=9;r=\"+w\""),
        ),
        (
            "two lines parameterised",
            &["a=b;c=1", "d=e;f=2"],
            Some("a=b;c=1, d=e;f=2"),
        ),
        ("trailing comma parameterised", &["a=b; q=1.0,"], None),
        ("empty item parameterised", &["a=b; q=1.0,,c=d"], None),
        ("lone equals", &["a="], None),
        ("lone comma", &[","], None),
        ("only spaces", &["   "], Some("")),
    ];
    for (name, raw, canonical) in cases {
        check(name, raw, *canonical);
    }
}

#[test]
fn numbers() {
    let cases: &[(&str, &str, Option<&str>)] = &[
        ("basic integer", "42", Some("42")),
        ("zero integer", "0", Some("0")),
        ("leading 0 zero", "00", Some("0")),
        ("negative zero", "-0", Some("0")),
        ("double negative zero", "--0", None),
        ("negative integer", "-42", Some("-42")),
        ("leading 0 integer", "042", Some("42")),
        ("leading 0 negative integer", "-042", Some("-42")),
        ("comma", "2,3", None),
        ("negative non-DIGIT first character", "-a23", None),
        ("sign out of place", "4-2", None),
        ("whitespace after sign", "- 42", None),
        ("long integer", "123456789012345", Some("123456789012345")),
        (
            "long negative integer",
            "-123456789012345",
            Some("-123456789012345"),
        ),
        ("too long integer", "1234567890123456", None),
        ("negative too long integer", "-1234567890123456", None),
        ("simple decimal", "1.23", Some("1.23")),
        ("negative decimal", "-1.23", Some("-1.23")),
        ("decimal, whitespace after decimal", "1. 23", None),
        ("decimal, whitespace before decimal", "1 .23", None),
        ("negative decimal, whitespace after sign", "- 1.23", None),
        (
            "tricky precision decimal",
            "123456789012.1",
            Some("123456789012.1"),
        ),
        ("double decimal decimal", "1.5.4", None),
        ("adjacent double decimal decimal", "1..4", None),
        (
            "decimal with three fractional digits",
            "1.123",
            Some("1.123"),
        ),
        (
            "negative decimal with three fractional digits",
            "-1.123",
            Some("-1.123"),
        ),
        ("decimal with four fractional digits", "1.1234", None),
        (
            "negative decimal with four fractional digits",
            "-1.1234",
            None,
        ),
        (
            "decimal with thirteen integer digits",
            "1234567890123.0",
            None,
        ),
        (
            "negative decimal with thirteen integer digits",
            "-1234567890123.0",
            None,
        ),
        (
            "decimal with twelve integer digits",
            "123456789012.123",
            Some("123456789012.123"),
        ),
        ("decimal trailing dot", "1.", None),
        ("decimal trailing zeros", "1.500", Some("1.5")),
        ("decimal zero", "0.0", Some("0.0")),
        ("decimal negative zero", "-0.000", Some("0.0")),
        ("decimal leading dot", ".5", None),
        ("plus sign", "+1", None),
        ("lone minus", "-", None),
        ("exponent", "1e3", None),
        ("integer with params", "1;a=2", Some("1;a=2")),
    ];
    for (name, raw, canonical) in cases {
        item(name, raw, *canonical);
    }
    // Values, not only their text.
    let d = parse_dictionary(b"i=-42, d=-1.5, big=999999999999999").unwrap();
    assert_eq!(d.get("i").unwrap().bare(), Some(&BareItem::Integer(-42)));
    assert_eq!(
        d.get("d").unwrap().bare(),
        Some(&BareItem::Decimal(Decimal { thousandths: -1500 }))
    );
    assert_eq!(
        d.get("big").unwrap().bare(),
        Some(&BareItem::Integer(MAX_INTEGER))
    );
}

#[test]
fn strings_tokens_binary_booleans() {
    let cases: &[(&str, &str, Option<&str>)] = &[
        ("basic string", "\"foo bar\"", Some("\"foo bar\"")),
        ("empty string", "\"\"", Some("\"\"")),
        (
            "long string",
            "\"foo foo foo foo foo foo foo foo foo foo foo foo\"",
            Some("\"foo foo foo foo foo foo foo foo foo foo foo foo\""),
        ),
        ("whitespace string", "\"   \"", Some("\"   \"")),
        ("non-ascii string", "\"f\u{fc}\u{fc}\"", None),
        ("tab in string", "\"\t\"", None),
        ("newline in string", "\" \n \"", None),
        ("DEL in string", "\"\x7f\"", None),
        ("single quoted string", "'foo'", None),
        ("unbalanced string", "\"foo", None),
        (
            "string quoting",
            "\"foo \\\"bar\\\" \\\\ baz\"",
            Some("\"foo \\\"bar\\\" \\\\ baz\""),
        ),
        ("bad string quoting", "\"foo \\,\"", None),
        ("ending string quote", "\"foo \\\"", None),
        ("abruptly ending string quote", "\"foo \\", None),
        ("basic token", "a_b-c.d3:f%00/*", Some("a_b-c.d3:f%00/*")),
        ("token with capitals", "fooBar", Some("fooBar")),
        ("token starting with capitals", "FooBar", Some("FooBar")),
        ("token starting with star", "*foo", Some("*foo")),
        ("token starting with digit", "1foo", None),
        ("token starting with slash", "/foo", None),
        ("token then garbage", "foo\"bar\"", None),
        ("basic binary", ":aGVsbG8=:", Some(":aGVsbG8=:")),
        ("empty binary", "::", Some("::")),
        ("bad paddding", ":aGVsbG8:", Some(":aGVsbG8=:")),
        ("bad end delimiter", ":aGVsbG8=", None),
        ("extra whitespace", ":aGVsb G8=:", None),
        ("extra chars", ":aGVsbG!8=:", None),
        ("suffix chars", ":aGVsbG8=!:", None),
        ("non-zero pad bits", ":iZ==:", Some(":iQ==:")),
        ("non-ASCII binary content", ":\u{e4}:", None),
        ("base64url binary", ":_-Ah:", None),
        ("padding in the middle", ":aG=Vs:", None),
        ("one lone character", ":a:", None),
        ("basic true boolean", "?1", Some("")),
        ("basic false boolean", "?0", Some("?0")),
        ("unknown boolean", "?Q", None),
        ("whitespace boolean", "? 1", None),
        ("negative zero boolean", "?-0", None),
        ("T boolean", "?T", None),
        ("F boolean", "?F", None),
        ("t boolean", "?t", None),
        ("f boolean", "?f", None),
        ("spelled-out True boolean", "?True", None),
        ("boolean followed by a digit", "?11", None),
        ("date item (RFC 9651, not 8941)", "@1659578233", None),
        ("display string (RFC 9651, not 8941)", "%\"f%c3%bc\"", None),
    ];
    for (name, raw, canonical) in cases {
        // `a=?1` serialises as the bare key `a`.
        let canonical = canonical.map(|c| {
            if c.is_empty() {
                "a".to_string()
            } else {
                format!("a={c}")
            }
        });
        check(name, &[&format!("a={raw}")], canonical.as_deref());
    }
    let d = parse_dictionary(b"s=\"a\\\"b\", t=foo/bar, b=:AAEC/w==:").unwrap();
    assert_eq!(
        d.get("s").unwrap().bare(),
        Some(&BareItem::String("a\"b".into()))
    );
    assert_eq!(
        d.get("t").unwrap().bare(),
        Some(&BareItem::Token("foo/bar".into()))
    );
    assert_eq!(
        d.get("b").unwrap().bare(),
        Some(&BareItem::ByteSequence(vec![0, 1, 2, 255]))
    );
}

#[test]
fn limits() {
    // RFC 8941 §3 minimums are supported.
    let keys: Vec<String> = (0..MAX_MEMBERS).map(|i| format!("k{i}")).collect();
    let d = parse_dictionary(keys.join(",").as_bytes()).unwrap();
    assert_eq!(d.len(), MAX_MEMBERS);
    let long_key = "a".repeat(64);
    assert!(parse_dictionary(format!("{long_key}=1").as_bytes()).is_ok());
    let params: String = (0..MAX_PARAMS).map(|i| format!(";p{i}")).collect();
    assert!(parse_dictionary(format!("a{params}").as_bytes()).is_ok());
    let inner: Vec<String> = (0..MAX_INNER).map(|i| i.to_string()).collect();
    assert!(parse_dictionary(format!("a=({})", inner.join(" ")).as_bytes()).is_ok());
    // Beyond them the field fails rather than costing quadratic time.
    assert!(parse_dictionary(format!("{},x", keys.join(",")).as_bytes()).is_err());
    assert!(parse_dictionary(format!("a{params};x").as_bytes()).is_err());
    assert!(parse_dictionary(format!("a=({} 1)", inner.join(" ")).as_bytes()).is_err());
    // Duplicates do not count twice.
    let dup = vec!["a=1"; 5000].join(",");
    assert_eq!(parse_dictionary(dup.as_bytes()).unwrap().len(), 1);
}

#[test]
fn serialiser_refuses_what_cannot_be_written() {
    let one = |bare| {
        Dictionary(vec![(
            "a".into(),
            Member::Item(Item {
                bare,
                params: vec![],
            }),
        )])
    };
    assert!(serialize_dictionary(&one(BareItem::Integer(MAX_INTEGER + 1))).is_err());
    assert!(serialize_dictionary(&one(BareItem::String("\n".into()))).is_err());
    assert!(serialize_dictionary(&one(BareItem::Token("1a".into()))).is_err());
    assert!(serialize_dictionary(&Dictionary(vec![(
        "A".into(),
        Member::Item(Item {
            bare: BareItem::Boolean(true),
            params: vec![]
        })
    )]))
    .is_err());
}

/// What the fuzz target checks, on a fixed pseudo-random sample so it runs
/// with the unit tests: no panic, and whatever parses serialises to a
/// canonical text that parses back to the same value.
#[test]
fn random_inputs_round_trip() {
    const ALPHABET: &[u8] = b"abcxyz019AZ \t,;=()\"\\:?*-./+%@_\n\x7f\xc3";
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut parsed, mut total) = (0, 0);
    for _ in 0..200_000 {
        let len = (next() % 24) as usize;
        let input: Vec<u8> = (0..len)
            .map(|_| ALPHABET[(next() % ALPHABET.len() as u64) as usize])
            .collect();
        total += 1;
        let Ok(d) = parse_dictionary(&input) else {
            continue;
        };
        parsed += 1;
        let text = serialize_dictionary(&d).expect("a parsed dictionary serialises");
        assert_eq!(
            parse_dictionary(text.as_bytes()),
            Ok(d.clone()),
            "{input:?} -> {text:?}"
        );
        assert_eq!(serialize_dictionary(&d).unwrap(), text);
    }
    // The sample reaches the parser's success paths, not only its errors.
    assert!(parsed > total / 100, "{parsed} of {total} parsed");
}
