-- Revenue and orders per store and day, over the fct_orders table (an idem table).
select dt, store_id,
       sum(amount_usd) as amount_usd_sum,
       count(*) as order_count,
       count(distinct customer_id) as customers
from fct_orders
where dt = $run_date
group by dt, store_id
