fn main() {
    libcni::skel::run(&dummy::Dummy)
}
