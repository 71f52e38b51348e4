// The stock is internal to groups (public only under `splitcount::raw`).
use splitcount::charge::Stock;

fn main() {
    let _: Option<Stock> = None;
}
