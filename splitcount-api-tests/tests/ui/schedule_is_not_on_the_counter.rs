// The worst-case schedule is a test and lab tool on `Config`, not part of
// the counter trait.
use splitcount::SplitCounter;

fn main() {
    let t = splitcount::Tree::new();
    let _ = t.worst_case_schedule(splitcount::counter::Side::Under);
}
