fn main() {
    libcni::skel::run(&ipvlan::Ipvlan)
}
