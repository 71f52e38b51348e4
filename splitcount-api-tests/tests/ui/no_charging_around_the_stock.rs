// A group's usage counter cannot be reached from its handle: charging it
// directly would bypass the group's stock, hooks and events.
fn main() {
    let h = splitcount::Hierarchy::default();
    let g = h.root().child("g").unwrap();
    let _ = g.usage_counter();
}
