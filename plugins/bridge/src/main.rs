fn main() {
    libcni::skel::run(&bridge::Bridge)
}
