//! The run's settings: the environment (`NEMESIS_SECONDS`, `NEMESIS_SEED`,
//! `NEMESIS_SELF_CHECK`, `NEMESIS_ROUND`), the rounds they make (a topology, a seed and
//! a fault window each), the workload's timing, and the client process's arguments.

use std::time::Duration;

/// The locks' TTL, every sidecar's `--default-ttl` and `--restart-hold-off`. 4 s: a
/// frozen sidecar's locks expire 2/3 of it (2.7 s) after the freeze at the earliest,
/// after the client's keepalive (1 s + 1 s) has told it to stop (docs/clients.md).
pub const TTL: Duration = Duration::from_secs(4);
pub const HOLD_OFF: Duration = TTL;
/// How long an acquire waits.
pub const WAIT: Duration = Duration::from_secs(2);
/// Every sidecar's `--clock-drift`: faked clock rates stay within it.
pub const CLOCK_DRIFT: f64 = 0.05;
/// Room for a loaded 2-core machine on top of what the contract allows (hold-off +
/// TTL for a key to be grantable again, the wait for an acquire's answer).
pub const SLACK: Duration = Duration::from_secs(3);
/// The default run: all topologies, fit for CI.
pub const DEFAULT_SECONDS: u64 = 140;

/// The store topologies a round runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topo {
    /// One Redis, RDB snapshots (`SAVE`), restarted from them.
    Rdb,
    /// One Redis with `appendonly yes`, restarted from an older copy of its AOF.
    Aof,
    /// Sentinel: a master, two replicas, three sentinels.
    Sentinel,
    /// Cluster: three masters with a replica each.
    Cluster,
    /// Redlock over three independent masters.
    Redlock,
}

impl Topo {
    pub const ALL: [Topo; 5] = [
        Topo::Rdb,
        Topo::Aof,
        Topo::Sentinel,
        Topo::Cluster,
        Topo::Redlock,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Topo::Rdb => "standalone-rdb",
            Topo::Aof => "standalone-aof",
            Topo::Sentinel => "sentinel",
            Topo::Cluster => "cluster",
            Topo::Redlock => "redlock",
        }
    }

    /// What a round costs besides its fault window (start, heal, checks, stop), about.
    fn overhead(self) -> u64 {
        match self {
            Topo::Sentinel => 14,
            Topo::Cluster => 8,
            _ => 5,
        }
    }

    /// The keys and their modes: `x` exclusive, `f` fair, `r` shared (readers and
    /// writers), `m2` a semaphore of 2. Redlock refuses semaphores and fair queues.
    pub fn keys(self) -> Vec<KeySpec> {
        let spec = match self {
            Topo::Redlock => "x0=x,x1=x,x2=x,r0=r",
            _ => "x0=x,x1=x,f0=f,r0=r,m0=m2",
        };
        KeySpec::parse_list(spec).expect("the built-in keys parse")
    }
}

/// One key of the workload.
#[derive(Clone, Debug)]
pub struct KeySpec {
    pub name: String,
    pub kind: char,
    pub limit: u32,
}

impl KeySpec {
    /// `NAME=KIND,...` (KIND `x`, `f`, `r`, `mN`).
    pub fn parse_list(text: &str) -> Result<Vec<Self>, String> {
        text.split(',')
            .map(|item| {
                let (name, kind) = item.split_once('=').ok_or(format!("bad key {item:?}"))?;
                let limit = kind.get(1..).unwrap_or("").parse().unwrap_or(0);
                let kind = kind.chars().next().ok_or(format!("bad key {item:?}"))?;
                Ok(Self {
                    name: name.into(),
                    kind,
                    limit,
                })
            })
            .collect()
    }

    pub fn list(keys: &[Self]) -> String {
        let one = |k: &Self| match k.kind {
            'm' => format!("{}=m{}", k.name, k.limit),
            kind => format!("{}={kind}", k.name),
        };
        keys.iter().map(one).collect::<Vec<_>>().join(",")
    }
}

/// What the environment asks for.
#[derive(Clone, Debug)]
pub struct Config {
    pub seconds: u64,
    pub seed: u64,
    pub self_check: bool,
    /// Only this round (replaying one round of a seed).
    pub only_round: Option<usize>,
}

impl Config {
    pub fn from_env() -> Result<Self, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let number = |name: &str, v: String| {
            v.trim()
                .parse::<u64>()
                .map_err(|_| format!("{name}={v:?}: a whole number is expected"))
        };
        let seconds = var("NEMESIS_SECONDS")
            .map(|v| number("NEMESIS_SECONDS", v))
            .transpose()?
            .unwrap_or(DEFAULT_SECONDS);
        let seed = match var("NEMESIS_SEED") {
            Some(v) => number("NEMESIS_SEED", v)?,
            // A fresh seed: the clock's nanoseconds and the pid, mixed.
            None => {
                mix(super::history::now_ns() ^ (u64::from(std::process::id()) << 32))
                    % 1_000_000_000
            }
        };
        let only_round = var("NEMESIS_ROUND")
            .map(|v| number("NEMESIS_ROUND", v).map(|n| n as usize))
            .transpose()?;
        Ok(Self {
            seconds: seconds.max(30),
            seed,
            self_check: var("NEMESIS_SELF_CHECK").is_some_and(|v| v != "0"),
            only_round,
        })
    }
}

/// One round: a topology, its own seed, how long faults are injected.
#[derive(Clone, Debug)]
pub struct RoundPlan {
    pub index: usize,
    pub topo: Topo,
    pub seed: u64,
    pub window: Duration,
    /// `--min-replica-acks` on Sentinel and Cluster (0 on the others).
    pub acks: u32,
    /// Each sidecar's clock rate (libfaketime), within [`CLOCK_DRIFT`].
    pub rates: [f64; 3],
    /// Cluster: `cluster-node-timeout` in ms. 1 s fails a frozen master over within a
    /// fault; 15 s (Redis' default) does not: the master stays frozen with its slots.
    pub node_timeout: u64,
    /// The self-check's round: a wrong client is added.
    pub wrong_client: bool,
}

/// The rounds of a run: the five topologies in turn, as many times as the time allows.
pub fn rounds(config: &Config) -> Vec<RoundPlan> {
    if config.self_check {
        return vec![plan(0, Topo::Rdb, config.seed, 12, true)];
    }
    let cycles = (config.seconds / 450).max(1) as usize;
    let per_round = config.seconds / (5 * cycles as u64);
    (0..5 * cycles)
        .map(|i| {
            let topo = Topo::ALL[i % 5];
            let window = per_round.saturating_sub(topo.overhead()).max(6);
            plan(i, topo, config.seed, window, false)
        })
        .filter(|r| config.only_round.is_none_or(|only| only == r.index))
        .collect()
}

fn plan(index: usize, topo: Topo, seed: u64, window: u64, wrong_client: bool) -> RoundPlan {
    let seed = mix(seed ^ mix(index as u64 + 1));
    let mut rng = super::common::Rng::new(seed);
    let acks = match topo {
        Topo::Sentinel | Topo::Cluster => rng.below(2) as u32,
        _ => 0,
    };
    // Most sidecars keep the real clock; some run up to 3% fast or slow (the drift
    // allowed is 5%).
    let rate = |rng: &mut super::common::Rng| match rng.below(5) {
        0 => 0.97,
        1 => 1.03,
        _ => 1.0,
    };
    let rates = [rate(&mut rng), rate(&mut rng), rate(&mut rng)];
    let node_timeout = [1000, 15_000][rng.below(2) as usize];
    RoundPlan {
        index,
        topo,
        seed,
        window: Duration::from_secs(window),
        acks,
        rates,
        node_timeout,
        wrong_client,
    }
}

/// splitmix64: spreads a seed's bits.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The arguments of a client process (the Rust one and the Python one take the same).
#[derive(Clone, Debug)]
pub struct WorkerArgs {
    pub id: String,
    pub addr: String,
    pub register: String,
    pub keys: Vec<KeySpec>,
    pub workers: u32,
    pub seed: u64,
    pub ttl: Duration,
    pub wait: Duration,
    pub wrong: bool,
}

impl WorkerArgs {
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            "--id".into(),
            self.id.clone(),
            "--addr".into(),
            self.addr.clone(),
            "--register".into(),
            self.register.clone(),
            "--keys".into(),
            KeySpec::list(&self.keys),
            "--workers".into(),
            self.workers.to_string(),
            "--seed".into(),
            self.seed.to_string(),
            "--ttl".into(),
            self.ttl.as_secs_f64().to_string(),
            "--wait".into(),
            self.wait.as_secs_f64().to_string(),
        ];
        if self.wrong {
            args.push("--wrong".into());
        }
        args
    }

    pub fn parse(args: &[String]) -> Result<Self, String> {
        let value = |name: &str| {
            let at = args
                .iter()
                .position(|a| a == name)
                .ok_or(format!("{name} missing"))?;
            args.get(at + 1)
                .cloned()
                .ok_or(format!("{name} needs a value"))
        };
        let secs = |name: &str| -> Result<Duration, String> {
            let v = value(name)?;
            v.parse::<f64>()
                .map(Duration::from_secs_f64)
                .map_err(|_| format!("{name} {v:?}"))
        };
        Ok(Self {
            id: value("--id")?,
            addr: value("--addr")?,
            register: value("--register")?,
            keys: KeySpec::parse_list(&value("--keys")?)?,
            workers: value("--workers")?
                .parse()
                .map_err(|_| "--workers".to_owned())?,
            seed: value("--seed")?.parse().map_err(|_| "--seed".to_owned())?,
            ttl: secs("--ttl")?,
            wait: secs("--wait")?,
            wrong: args.iter().any(|a| a == "--wrong"),
        })
    }
}
