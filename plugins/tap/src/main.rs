fn main() {
    libcni::skel::run(&tap::Tap)
}
