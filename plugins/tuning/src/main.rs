fn main() {
    libcni::skel::run(&tuning::Tuning)
}
