//! The calls of `lua/fleet.lua`: an instance's figures published to the fleet, and the fleet
//! read back. Two keys that share one hash tag, and a blob of any bytes: never joined.

use ::redis::ScriptInvocation;

use super::super::resp::{bulk, push_count};
use super::{Lua, ScriptCall, Scripts};
use crate::store::{FLEET_MAX_BYTES, FLEET_MAX_INSTANCES, FLEET_STALE};

/// What a call of `lua/fleet.lua` does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum FleetOp<'a> {
    /// keeps `blob` as instance `id`'s figures
    Publish { id: &'a str, blob: &'a [u8] },
    /// reads every instance's figures
    Read,
}

/// A call of `lua/fleet.lua`: KEYS are the fleet's hash and its `:seen` set.
pub(crate) struct FleetCall<'a> {
    lua: &'a Lua,
    /// `{<key_prefix>:fleet}`
    pub(crate) key: &'a str,
    /// `{<key_prefix>:fleet}:seen`
    seen: String,
    args: Vec<&'a [u8]>,
    /// the numbers among the arguments, written once
    numbers: [String; 3],
    publish: bool,
}

impl Scripts {
    /// The call of `lua/fleet.lua` doing `op` on the fleet kept at `key`.
    pub(crate) fn fleet<'a>(&'a self, key: &'a str, op: FleetOp<'a>) -> FleetCall<'a> {
        let (publish, args): (bool, Vec<&'a [u8]>) = match op {
            FleetOp::Publish { id, blob } => (true, vec![id.as_bytes(), blob]),
            FleetOp::Read => (false, Vec::new()),
        };
        FleetCall {
            lua: &self.fleet,
            key,
            seen: format!("{key}:seen"),
            args,
            numbers: [
                FLEET_STALE.as_millis().to_string(),
                FLEET_MAX_BYTES.to_string(),
                FLEET_MAX_INSTANCES.to_string(),
            ],
            publish,
        }
    }
}

impl<'a> FleetCall<'a> {
    /// ARGV in the script's order.
    fn argv(&self) -> Vec<&[u8]> {
        let [stale, bytes, instances] = &self.numbers;
        if self.publish {
            let mut argv = vec![
                b"publish".as_slice(),
                stale.as_bytes(),
                bytes.as_bytes(),
                instances.as_bytes(),
            ];
            argv.extend(self.args.iter().copied());
            argv
        } else {
            vec![b"read".as_slice(), stale.as_bytes()]
        }
    }
}

/// Never joined.
impl<'a> ScriptCall<'a> for FleetCall<'a> {
    fn key(&self) -> &str {
        self.key
    }

    fn encode(&self, out: &mut Vec<u8>, body: bool) {
        let argv = self.argv();
        out.push(b'*');
        push_count(out, 5 + argv.len() as u64);
        if body {
            bulk(out, b"EVAL");
            bulk(out, self.lua.body.as_bytes());
        } else {
            bulk(out, b"EVALSHA");
            bulk(out, self.lua.script.get_hash().as_bytes());
        }
        bulk(out, b"2");
        bulk(out, self.key.as_bytes());
        bulk(out, self.seen.as_bytes());
        for arg in argv {
            bulk(out, arg);
        }
    }

    fn check(&self) -> Option<super::Check> {
        None
    }

    fn invocation(&self) -> ScriptInvocation<'a> {
        let mut inv = self.lua.script.key(self.key);
        inv.key(self.seen.as_str());
        for arg in self.argv() {
            inv.arg(arg);
        }
        inv
    }
}
