fn main() {
    dhcp::main_with_args(&std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>())
}
