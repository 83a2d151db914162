fn main() {
    dhcp::main_with_args(&std::env::args().collect::<Vec<_>>())
}
