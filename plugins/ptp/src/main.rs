fn main() {
    libcni::skel::run(&ptp::Ptp)
}
