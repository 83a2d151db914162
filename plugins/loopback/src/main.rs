fn main() {
    libcni::skel::run(&loopback::Loopback)
}
