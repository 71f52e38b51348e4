// The per-CPU arena is a building block: reachable as
// `splitcount::raw::percpu`, not as a top-level module.
use splitcount::percpu::Arena;

fn main() {
    let _ = Arena::host();
}
