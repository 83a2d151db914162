fn main() {
    libcni::skel::run(&bandwidth::Bandwidth)
}
