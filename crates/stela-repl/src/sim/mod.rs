//! placeholder replaced below
pub struct SimConfig;
impl SimConfig { pub fn three_nodes() -> SimConfig { SimConfig } }
pub struct Outcome { pub failure: Option<String> }
impl Outcome { pub fn report(&self) -> String { String::new() } }
pub fn run(_seed: u64, _c: &SimConfig) -> Outcome { Outcome { failure: None } }
