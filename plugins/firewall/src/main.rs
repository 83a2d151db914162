fn main() {
    libcni::skel::run(&firewall::Firewall)
}
