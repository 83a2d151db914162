fn main() {
    libcni::skel::run(&ipvlan::PLUGIN)
}
