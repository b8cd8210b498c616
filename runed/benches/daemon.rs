fn main() {
    println!("daemon bench: not yet written");
}
