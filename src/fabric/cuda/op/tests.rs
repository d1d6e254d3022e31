use super::*;

#[test]
fn ranks_sharing_a_gpu_are_counted_by_the_busiest_gpu() {
    let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(ranks_per_gpu(&ids(&["a", "b", "c", "d"])), 1);
    assert_eq!(ranks_per_gpu(&ids(&["a", "a", "a", "a"])), 4);
    assert_eq!(ranks_per_gpu(&ids(&["a", "a", "b"])), 2);
    assert_eq!(ranks_per_gpu(&[]), 1);
}

#[test]
fn without_a_driver_the_op_says_so() {
    if super::super::visible_gpus() > 0 {
        return;
    }
    let e = Op::open(0).err().unwrap();
    assert!(
        e.to_string().contains("driver") || e.to_string().contains("GPU"),
        "{e}"
    );
}
