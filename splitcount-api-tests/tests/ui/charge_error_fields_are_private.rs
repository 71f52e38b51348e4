// A ChargeError is read through its accessors (`limit()`, ...).
fn main() {
    let h = splitcount::Hierarchy::default();
    let g = h.root().child("g").unwrap();
    g.set_max(1).unwrap();
    let e = g.charge(2).unwrap_err();
    let _ = e.limit;
}
