fn main() {
    libcni::skel::run(&sbr::Sbr)
}
