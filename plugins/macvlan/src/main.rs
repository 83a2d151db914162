fn main() {
    libcni::skel::run(&macvlan::PLUGIN)
}
