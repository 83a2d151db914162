fn main() {
    libcni::skel::run(&macvlan::Macvlan)
}
