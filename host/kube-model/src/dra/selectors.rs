//! Device selectors: CEL expressions compiled once each and evaluated per device with the
//! variables Kubernetes gives them, and the `quantity` and `semver` functions Gantry supports.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use super::values::NANOS;
use super::{Device, Quantity, Semver};
use cel::extractors::This;
use cel::objects::{Key, Map};
use cel::{Context, Env, ExecutionError, Program, Value};

struct Compiled {
    program: Program,
    /// The expression's string literals: any of them used as a domain the device lacks must
    /// index to an empty map, as Kubernetes' `device.attributes` and `device.capacity` do.
    literals: Vec<String>,
}

/// Device selectors, each distinct expression compiled once (a scheduler sees the same few
/// DeviceClass and claim selectors for every node and every cycle), then evaluated per device.
pub struct SelectorCache {
    env: Arc<Env>,
    compiled: HashMap<String, Result<Compiled, String>>,
    compilations: usize,
}

impl Default for SelectorCache {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for SelectorCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SelectorCache")
            .field("expressions", &self.compiled.len())
            .field("compilations", &self.compilations)
            .finish()
    }
}

impl SelectorCache {
    /// An empty cache over CEL's standard library.
    pub fn new() -> Self {
        Self {
            env: Arc::new(Env::stdlib()),
            compiled: HashMap::new(),
            compilations: 0,
        }
    }

    /// How many times an expression was compiled: once per distinct expression, ever.
    pub fn compilations(&self) -> usize {
        self.compilations
    }

    /// Compiles `expression` unless it already was; the compile error, if any, is kept too so
    /// a bad selector is not re-parsed for every device.
    pub fn compile(&mut self, expression: &str) -> Result<(), String> {
        self.entry(expression).map(|_| ())
    }

    fn entry(&mut self, expression: &str) -> Result<&Compiled, String> {
        if !self.compiled.contains_key(expression) {
            self.compilations += 1;
            let compiled = self
                .env
                .compile(expression)
                .map(|program| Compiled {
                    program,
                    literals: string_literals(expression),
                })
                .map_err(|e| {
                    format!(
                        "CEL selector {expression:?} does not compile: {}",
                        one_line(&e.to_string())
                    )
                });
            self.compiled.insert(expression.to_string(), compiled);
        }
        match self.compiled.get(expression) {
            Some(Ok(c)) => Ok(c),
            Some(Err(e)) => Err(e.clone()),
            None => Err(format!("CEL selector {expression:?} is not compiled")),
        }
    }

    /// Whether `device` satisfies `expression`. A compile error, a runtime error or a result
    /// that is not a bool is an `Err` naming the expression (kube-scheduler reports a CEL
    /// runtime error the same way and allocates nothing); never a panic, never a match.
    pub fn matches(&mut self, expression: &str, device: &Device) -> Result<bool, String> {
        let env = self.env.clone();
        let compiled = self.entry(expression)?;
        let mut context = Context::with_env(env);
        register_functions(&mut context)
            .map_err(|e| format!("CEL selector {expression:?}: cannot set up: {e}"))?;
        context.add_variable_from_value("device", device_value(device, &compiled.literals));
        match compiled.program.execute(&context) {
            Ok(Value::Bool(b)) => Ok(b),
            Ok(other) => Err(format!(
                "CEL selector {expression:?} evaluated to {}, not bool, for device {}",
                other.type_of(),
                device.id
            )),
            Err(e) => Err(format!(
                "CEL runtime error in selector {expression:?} for device {}: {e}",
                device.id
            )),
        }
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The contents of every quoted string literal in a CEL expression (a superset is harmless:
/// it only pads the domain maps with empty entries).
fn string_literals(expression: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = expression.chars();
    while let Some(c) = chars.next() {
        if c != '"' && c != '\'' {
            continue;
        }
        let mut literal = String::new();
        while let Some(d) = chars.next() {
            match d {
                '\\' => {
                    if let Some(e) = chars.next() {
                        literal.push(e);
                    }
                }
                _ if d == c => break,
                _ => literal.push(d),
            }
        }
        out.push(literal);
    }
    out
}

fn string_key(s: &str) -> Key {
    Key::String(Arc::new(s.to_string()))
}

fn map_value(map: HashMap<Key, Value>) -> Value {
    Value::Map(Map { map: Arc::new(map) })
}

/// `device.attributes` or `device.capacity`: domain → name → value, with an empty map for any
/// domain the expression names but the device lacks.
fn domain_maps<'a>(entries: impl Iterator<Item = (&'a String, Value)>, pad: &[String]) -> Value {
    let mut domains: BTreeMap<&str, HashMap<Key, Value>> = BTreeMap::new();
    for (qualified, value) in entries {
        let (domain, name) = qualified.split_once('/').unwrap_or(("", qualified));
        domains
            .entry(domain)
            .or_default()
            .insert(string_key(name), value);
    }
    let mut outer: HashMap<Key, Value> = domains
        .into_iter()
        .map(|(d, inner)| (string_key(d), map_value(inner)))
        .collect();
    for literal in pad {
        outer
            .entry(string_key(literal))
            .or_insert_with(|| map_value(HashMap::new()));
    }
    map_value(outer)
}

fn device_value(device: &Device, pad: &[String]) -> Value {
    let attributes = domain_maps(device.attributes.iter().map(|(k, v)| (k, v.to_cel())), pad);
    let capacity = domain_maps(
        device
            .capacity
            .iter()
            .map(|(k, q)| (k, Value::Opaque(Arc::new(*q)))),
        pad,
    );
    let mut fields = HashMap::new();
    fields.insert(
        string_key("driver"),
        Value::String(Arc::new(device.id.driver.clone())),
    );
    fields.insert(
        string_key("allowMultipleAllocations"),
        Value::Bool(device.allow_multiple_allocations),
    );
    fields.insert(string_key("attributes"), attributes);
    fields.insert(string_key("capacity"), capacity);
    map_value(fields)
}

enum Ordered<'a> {
    Quantity(&'a Quantity),
    Semver(&'a Semver),
}

fn ordered<'a>(function: &str, v: &'a Value) -> Result<Ordered<'a>, ExecutionError> {
    if let Value::Opaque(o) = v {
        if let Some(q) = o.downcast_ref::<Quantity>() {
            return Ok(Ordered::Quantity(q));
        }
        if let Some(s) = o.downcast_ref::<Semver>() {
            return Ok(Ordered::Semver(s));
        }
    }
    Err(ExecutionError::function_error(
        function,
        format!("wants a quantity or a semver, got {}", v.type_of()),
    ))
}

fn compare(function: &str, this: &Value, other: &Value) -> Result<Ordering, ExecutionError> {
    match (ordered(function, this)?, ordered(function, other)?) {
        (Ordered::Quantity(a), Ordered::Quantity(b)) => Ok(a.cmp(b)),
        (Ordered::Semver(a), Ordered::Semver(b)) => Ok(a.cmp(b)),
        _ => Err(ExecutionError::function_error(
            function,
            "cannot compare a quantity with a semver",
        )),
    }
}

fn quantity_of<'a>(function: &str, v: &'a Value) -> Result<&'a Quantity, ExecutionError> {
    match ordered(function, v)? {
        Ordered::Quantity(q) => Ok(q),
        Ordered::Semver(_) => Err(ExecutionError::function_error(
            function,
            "wants a quantity, got a semver",
        )),
    }
}

fn semver_of<'a>(function: &str, v: &'a Value) -> Result<&'a Semver, ExecutionError> {
    match ordered(function, v)? {
        Ordered::Semver(s) => Ok(s),
        Ordered::Quantity(_) => Err(ExecutionError::function_error(
            function,
            "wants a semver, got a quantity",
        )),
    }
}

fn cel_quantity(text: Arc<String>) -> Result<Value, ExecutionError> {
    Quantity::parse(&text)
        .map(|q| Value::Opaque(Arc::new(q)))
        .ok_or_else(|| {
            ExecutionError::function_error("quantity", format!("{text:?} is not a quantity"))
        })
}

fn cel_is_quantity(text: Arc<String>) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(Quantity::parse(&text).is_some()))
}

fn cel_semver(text: Arc<String>) -> Result<Value, ExecutionError> {
    Semver::parse(&text)
        .map(|s| Value::Opaque(Arc::new(s)))
        .ok_or_else(|| {
            ExecutionError::function_error("semver", format!("{text:?} is not a semantic version"))
        })
}

fn cel_is_semver(text: Arc<String>) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(Semver::parse(&text).is_some()))
}

fn cel_compare_to(This(this): This<Value>, other: Value) -> Result<Value, ExecutionError> {
    Ok(Value::Int(match compare("compareTo", &this, &other)? {
        Ordering::Less => -1,
        Ordering::Equal => 0,
        Ordering::Greater => 1,
    }))
}

fn cel_is_greater_than(This(this): This<Value>, other: Value) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(
        compare("isGreaterThan", &this, &other)? == Ordering::Greater,
    ))
}

fn cel_is_less_than(This(this): This<Value>, other: Value) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(
        compare("isLessThan", &this, &other)? == Ordering::Less,
    ))
}

fn cel_is_integer(This(this): This<Value>) -> Result<Value, ExecutionError> {
    let q = quantity_of("isInteger", &this)?;
    Ok(Value::Bool(
        q.is_integer() && i64::try_from(q.nanos / NANOS).is_ok(),
    ))
}

fn cel_as_integer(This(this): This<Value>) -> Result<Value, ExecutionError> {
    let q = quantity_of("asInteger", &this)?;
    if !q.is_integer() {
        return Err(ExecutionError::function_error(
            "asInteger",
            "the quantity is not an integer",
        ));
    }
    i64::try_from(q.nanos / NANOS)
        .map(Value::Int)
        .map_err(|_| ExecutionError::function_error("asInteger", "the quantity overflows int"))
}

fn cel_sign(This(this): This<Value>) -> Result<Value, ExecutionError> {
    let q = quantity_of("sign", &this)?;
    Ok(Value::Int(match q.nanos.cmp(&0) {
        Ordering::Less => -1,
        Ordering::Equal => 0,
        Ordering::Greater => 1,
    }))
}

fn semver_part(
    function: &str,
    this: &Value,
    part: fn(&Semver) -> u64,
) -> Result<Value, ExecutionError> {
    let s = semver_of(function, this)?;
    i64::try_from(part(s))
        .map(Value::Int)
        .map_err(|_| ExecutionError::function_error(function, "overflows int"))
}

fn cel_major(This(this): This<Value>) -> Result<Value, ExecutionError> {
    semver_part("major", &this, |s| s.major)
}

fn cel_minor(This(this): This<Value>) -> Result<Value, ExecutionError> {
    semver_part("minor", &this, |s| s.minor)
}

fn cel_patch(This(this): This<Value>) -> Result<Value, ExecutionError> {
    semver_part("patch", &this, |s| s.patch)
}

/// The subset of Kubernetes' `quantity` and `semver` CEL libraries Gantry supports.
fn register_functions(context: &mut Context) -> Result<(), cel::DeclarationError> {
    context.add_function("quantity", cel_quantity)?;
    context.add_function("isQuantity", cel_is_quantity)?;
    context.add_function("semver", cel_semver)?;
    context.add_function("isSemver", cel_is_semver)?;
    context.add_function("compareTo", cel_compare_to)?;
    context.add_function("isGreaterThan", cel_is_greater_than)?;
    context.add_function("isLessThan", cel_is_less_than)?;
    context.add_function("isInteger", cel_is_integer)?;
    context.add_function("asInteger", cel_as_integer)?;
    context.add_function("sign", cel_sign)?;
    context.add_function("major", cel_major)?;
    context.add_function("minor", cel_minor)?;
    context.add_function("patch", cel_patch)?;
    Ok(())
}
